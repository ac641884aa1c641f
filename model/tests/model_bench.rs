//! Throughput of the CPU model on the Base builtin (dummy weights). Ignored by default: run with
//! `cargo test --release -p model --test model_bench -- --ignored --nocapture`.
//! Prints numbers only; tests never assert on wall-clock speed.

use std::time::Instant;

use model::{BuiltinSize, KvBuffers, LlamaModel, ModelConfig, SeqInput};

#[test]
#[ignore]
fn base_throughput() {
    let model = LlamaModel::dummy(ModelConfig::builtin(BuiltinSize::Base), 1);
    let ctx = 128;
    let steps = 32;
    let prompt: Vec<u32> = (0..512).map(|i| (i * 37 % 8000) as u32 + 3).collect();

    // Prefill of a 512-token prompt.
    let mut kv = KvBuffers::new(model.config(), 512);
    let slots: Vec<u32> = (0..512).collect();
    model
        .forward(
            &mut kv,
            &[SeqInput {
                new_tokens: &prompt[..16],
                start_pos: 0,
                slots: &slots[..16],
            }],
        )
        .unwrap();
    let t = Instant::now();
    model
        .forward(
            &mut kv,
            &[SeqInput {
                new_tokens: &prompt,
                start_pos: 0,
                slots: &slots,
            }],
        )
        .unwrap();
    let dt = t.elapsed().as_secs_f64();
    println!("prefill 512 tokens: {:.3}s = {:.0} tok/s", dt, 512.0 / dt);

    for batch in [1usize, 32] {
        let total = batch * (ctx + steps);
        let mut kv = KvBuffers::new(model.config(), total);
        let seq_slots: Vec<Vec<u32>> = (0..batch)
            .map(|b| ((b * (ctx + steps)) as u32..((b + 1) * (ctx + steps)) as u32).collect())
            .collect();
        let toks: Vec<Vec<u32>> = (0..batch)
            .map(|b| prompt[b..b + ctx + steps].to_vec())
            .collect();
        let pre: Vec<SeqInput> = (0..batch)
            .map(|b| SeqInput {
                new_tokens: &toks[b][..ctx],
                start_pos: 0,
                slots: &seq_slots[b][..ctx],
            })
            .collect();
        model.forward(&mut kv, &pre).unwrap();
        let t = Instant::now();
        for s in 0..steps {
            let p = ctx + s;
            let step: Vec<SeqInput> = (0..batch)
                .map(|b| SeqInput {
                    new_tokens: &toks[b][p..=p],
                    start_pos: p,
                    slots: &seq_slots[b][..=p],
                })
                .collect();
            model.forward(&mut kv, &step).unwrap();
        }
        let dt = t.elapsed().as_secs_f64();
        println!(
            "decode batch {batch} (ctx {ctx}): {:.2} ms/step = {:.0} tok/s",
            dt * 1e3 / steps as f64,
            (batch * steps) as f64 / dt
        );
    }
}
