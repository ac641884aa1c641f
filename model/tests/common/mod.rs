//! What the worker's integration tests share: running this test binary again as a child (one
//! kernel path per process, since the path is fixed once per process).

use std::process::Command;

/// A command that runs this test binary again. Under an emulator (the aarch64 tests run under
/// qemu-user, see `.ci/aarch64`) the child needs the same runner: `DPSERVE_TEST_RUNNER` names
/// it, program and arguments split at spaces.
pub fn this_binary() -> Command {
    let exe = std::env::current_exe().expect("test binary");
    match std::env::var("DPSERVE_TEST_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => {
            let mut words = runner.split_whitespace();
            let mut cmd = Command::new(words.next().expect("a runner program"));
            cmd.args(words).arg(exe);
            cmd
        }
        _ => Command::new(exe),
    }
}

/// Runs this binary's `child_check` test once per kernel path this CPU supports, with
/// `child_var` set (the child runs the check; the parent test returns at once when it sees the
/// variable) and the path forced. Each child must succeed and print at least one line holding
/// `marker`; returns each path's lines from the marker on, echoed to stderr.
#[allow(dead_code)]
pub fn per_path_lines(child_var: &str, marker: &str) -> Vec<(kernels::KernelPath, Vec<String>)> {
    kernels::KernelPath::all_supported()
        .into_iter()
        .map(|p| {
            let out = this_binary()
                .args(["--exact", "child_check", "--nocapture", "--test-threads=1"])
                .env(child_var, "1")
                .env(kernels::KERNEL_PATH_ENV, p.name())
                .output()
                .expect("start child");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{p}: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let lines: Vec<String> = stdout
                .lines()
                .filter_map(|l| l.find(marker).map(|i| l[i..].to_string()))
                .collect();
            assert!(
                !lines.is_empty(),
                "{p}: the child checked nothing: {stdout}"
            );
            for l in &lines {
                eprintln!("{l}");
            }
            (p, lines)
        })
        .collect()
}

/// That every path's lines end in the same words (the logits digests the children print last),
/// in the same order.
#[allow(dead_code)]
pub fn assert_same_last_words(per_path: &[(kernels::KernelPath, Vec<String>)], what: &str) {
    let last = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .map(|l| l.rsplit(' ').next().unwrap_or_default().to_string())
            .collect()
    };
    let (first, want) = (&per_path[0].0, last(&per_path[0].1));
    for (p, lines) in &per_path[1..] {
        assert_eq!(last(lines), want, "{p} and {first} give different {what}");
    }
}

/// Each of `prompts` prefilled alone and all of them in one batch: `m` gives each the same
/// logits, bit for bit (a token's result never depends on its batch).
#[allow(dead_code)]
pub fn assert_batch_invariant(name: &str, m: &model::LlamaModel, prompts: &[Vec<u32>]) {
    use model::{KvBuffers, SeqInput};
    let slots: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(s, t)| (0..t.len()).map(|p| (s * 64 + p) as u32).collect())
        .collect();
    let input = |i: usize| SeqInput {
        new_tokens: &prompts[i],
        start_pos: 0,
        slots: &slots[i],
    };
    let pool = prompts.len() * 64;
    let mut kv = KvBuffers::new(m.config(), pool);
    let all: Vec<SeqInput<'_>> = (0..prompts.len()).map(input).collect();
    let batched = m.forward(&mut kv, &all).expect("forward");
    let vocab = m.config().vocab_size;
    for i in 0..prompts.len() {
        let mut kv = KvBuffers::new(m.config(), pool);
        let alone = m.forward(&mut kv, &[input(i)]).expect("forward");
        let same = alone
            .iter()
            .zip(&batched[i * vocab..(i + 1) * vocab])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name}: prompt {i} batched differs from alone");
    }
}

/// An FNV-1a 64 digest of the bits of `logits` (what a child prints for its parent to compare).
#[allow(dead_code)]
pub fn logits_digest<'a>(logits: impl IntoIterator<Item = &'a f32>) -> u64 {
    logits.into_iter().fold(0xcbf29ce484222325u64, |h, v| {
        (h ^ v.to_bits() as u64).wrapping_mul(0x100000001b3)
    })
}
