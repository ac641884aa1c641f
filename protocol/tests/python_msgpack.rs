//! Cross-language check: Python's `msgpack` reads every golden frame as the documented map, and
//! what Python packs back decodes here. Skipped (passing, with a note) when `python3` or its
//! `msgpack` module is missing.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{examples, from_hex, to_hex};
use protocol::{decode, encode, Envelope};

/// For each hex frame on stdin: the JSON of `msgpack.unpackb(frame)`, a tab, and the hex of
/// `msgpack.packb` of that object (Python's own encoding: f64 floats, its own int widths).
const SCRIPT: &str = r#"
import json, sys, msgpack
for line in sys.stdin:
    obj = msgpack.unpackb(bytes.fromhex(line.strip()))
    assert obj["v"] == 1 and len(obj["msg"]) == 1, obj
    print(json.dumps(obj) + "\t" + msgpack.packb(obj).hex())
"#;

fn python_has_msgpack() -> bool {
    Command::new("python3")
        .args(["-c", "import msgpack"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn python_msgpack_reads_and_writes_golden_frames() {
    if !python_has_msgpack() {
        eprintln!("skipped: python3 with the msgpack module is not available");
        return;
    }
    let examples = examples();
    let input: String = examples
        .iter()
        .map(|(_, msg)| to_hex(&encode(msg).unwrap()) + "\n")
        .collect();
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), examples.len());

    for ((name, msg), line) in examples.iter().zip(lines) {
        let (json, repacked) = line.split_once('\t').expect("json<TAB>hex");
        let seen: serde_json::Value = serde_json::from_str(json).unwrap();
        let expected = serde_json::to_value(Envelope::new(msg.clone())).unwrap();
        assert_eq!(seen, expected, "{name}: what Python reads");
        let back = decode(&from_hex(repacked)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&back, msg, "{name}: what Python writes");
    }
}
