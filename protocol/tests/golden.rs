//! Golden byte vectors and the compatibility rules of the wire contract (`WIRE.md`).
//!
//! The hex below is the exact output of `protocol::encode`; `WIRE.md` quotes the same bytes
//! (checked by `wire_doc.rs`). A change here is a wire change: every peer must follow.

mod common;

use common::{examples, from_hex, to_hex_lines};
use protocol::{
    codec::encode_envelope, decode, encode, DecodeError, Envelope, FlushCache, GenerateReq,
    Message, SamplingParams, Shutdown,
};
use serde_json::{json, Value};

/// (example name in `common::examples`, expected frame).
const GOLDEN: &[(&str, &str)] = &[
    (
        "GenerateReq",
        "
        82 a1 76 01 a3 6d 73 67 81 ab 47 65 6e 65 72 61
        74 65 52 65 71 8b a3 72 69 64 a2 72 31 a9 69 6e
        70 75 74 5f 69 64 73 93 01 cd 3a c3 cd 0c 72 a8
        73 61 6d 70 6c 69 6e 67 8c ae 6d 61 78 5f 6e 65
        77 5f 74 6f 6b 65 6e 73 10 ab 74 65 6d 70 65 72
        61 74 75 72 65 ca 3f 00 00 00 a5 74 6f 70 5f 70
        ca 3f 40 00 00 a5 74 6f 70 5f 6b 28 a5 6d 69 6e
        5f 70 ca 00 00 00 00 a4 73 65 65 64 07 b2 72 65
        70 65 74 69 74 69 6f 6e 5f 70 65 6e 61 6c 74 79
        ca 3f 80 00 00 b1 66 72 65 71 75 65 6e 63 79 5f
        70 65 6e 61 6c 74 79 ca 00 00 00 00 b0 70 72 65
        73 65 6e 63 65 5f 70 65 6e 61 6c 74 79 ca 00 00
        00 00 ae 73 74 6f 70 5f 74 6f 6b 65 6e 5f 69 64
        73 91 02 aa 69 67 6e 6f 72 65 5f 65 6f 73 c2 aa
        6c 6f 67 69 74 5f 62 69 61 73 91 92 cd 0c 72 ca
        c0 20 00 00 a6 73 74 72 65 61 6d c3 ab 72 6f 75
        74 69 6e 67 5f 6b 65 79 a7 75 73 65 72 2d 34 32
        ae 72 6f 75 74 65 64 5f 64 70 5f 72 61 6e 6b c0
        ae 62 6f 6f 74 73 74 72 61 70 5f 72 6f 6f 6d c0
        ae 72 65 74 75 72 6e 5f 6c 6f 67 70 72 6f 62 c3
        b0 74 6f 70 5f 6c 6f 67 70 72 6f 62 73 5f 6e 75
        6d 02 ab 72 65 63 65 69 76 65 64 5f 61 74 cb 41
        d9 54 fc 40 10 00 00 ac 64 69 73 70 61 74 63 68
        5f 73 65 71 07
        ",
    ),
    (
        "GenerateReq-disagg",
        "
        82 a1 76 01 a3 6d 73 67 81 ab 47 65 6e 65 72 61
        74 65 52 65 71 8c a3 72 69 64 a2 72 33 a9 69 6e
        70 75 74 5f 69 64 73 92 01 cd 3a c3 a8 73 61 6d
        70 6c 69 6e 67 8c ae 6d 61 78 5f 6e 65 77 5f 74
        6f 6b 65 6e 73 cc 80 ab 74 65 6d 70 65 72 61 74
        75 72 65 ca 3f 80 00 00 a5 74 6f 70 5f 70 ca 3f
        80 00 00 a5 74 6f 70 5f 6b ff a5 6d 69 6e 5f 70
        ca 00 00 00 00 a4 73 65 65 64 c0 b2 72 65 70 65
        74 69 74 69 6f 6e 5f 70 65 6e 61 6c 74 79 ca 3f
        80 00 00 b1 66 72 65 71 75 65 6e 63 79 5f 70 65
        6e 61 6c 74 79 ca 00 00 00 00 b0 70 72 65 73 65
        6e 63 65 5f 70 65 6e 61 6c 74 79 ca 00 00 00 00
        ae 73 74 6f 70 5f 74 6f 6b 65 6e 5f 69 64 73 90
        aa 69 67 6e 6f 72 65 5f 65 6f 73 c2 aa 6c 6f 67
        69 74 5f 62 69 61 73 90 a6 73 74 72 65 61 6d c2
        ab 72 6f 75 74 69 6e 67 5f 6b 65 79 c0 ae 72 6f
        75 74 65 64 5f 64 70 5f 72 61 6e 6b c0 ae 62 6f
        6f 74 73 74 72 61 70 5f 72 6f 6f 6d cf 00 00 01
        1f 71 fb 04 cb ae 72 65 74 75 72 6e 5f 6c 6f 67
        70 72 6f 62 c2 b0 74 6f 70 5f 6c 6f 67 70 72 6f
        62 73 5f 6e 75 6d 00 ab 72 65 63 65 69 76 65 64
        5f 61 74 cb 41 d9 54 fc 40 10 00 00 ac 64 69 73
        70 61 74 63 68 5f 73 65 71 02 a6 64 69 73 61 67
        67 84 a4 72 6f 6f 6d cf 00 00 01 1f 71 fb 04 cb
        ac 70 72 65 66 69 6c 6c 5f 72 61 6e 6b 00 ab 64
        65 63 6f 64 65 5f 72 61 6e 6b 01 b3 70 72 65 66
        69 6c 6c 5f 6b 76 5f 65 6e 64 70 6f 69 6e 74 b3
        74 63 70 3a 2f 2f 31 30 2e 30 2e 30 2e 35 3a 37
        30 31 30
        ",
    ),
    (
        "GenerateReq-constraint",
        "
        82 a1 76 01 a3 6d 73 67 81 ab 47 65 6e 65 72 61
        74 65 52 65 71 8b a3 72 69 64 a2 72 34 a9 69 6e
        70 75 74 5f 69 64 73 92 01 cd 3a c3 a8 73 61 6d
        70 6c 69 6e 67 8d ae 6d 61 78 5f 6e 65 77 5f 74
        6f 6b 65 6e 73 20 ab 74 65 6d 70 65 72 61 74 75
        72 65 ca 00 00 00 00 a5 74 6f 70 5f 70 ca 3f 80
        00 00 a5 74 6f 70 5f 6b ff a5 6d 69 6e 5f 70 ca
        00 00 00 00 a4 73 65 65 64 c0 b2 72 65 70 65 74
        69 74 69 6f 6e 5f 70 65 6e 61 6c 74 79 ca 3f 80
        00 00 b1 66 72 65 71 75 65 6e 63 79 5f 70 65 6e
        61 6c 74 79 ca 00 00 00 00 b0 70 72 65 73 65 6e
        63 65 5f 70 65 6e 61 6c 74 79 ca 00 00 00 00 ae
        73 74 6f 70 5f 74 6f 6b 65 6e 5f 69 64 73 90 aa
        69 67 6e 6f 72 65 5f 65 6f 73 c2 aa 6c 6f 67 69
        74 5f 62 69 61 73 90 aa 63 6f 6e 73 74 72 61 69
        6e 74 82 a4 6b 69 6e 64 ab 6a 73 6f 6e 5f 73 63
        68 65 6d 61 a4 74 65 78 74 b2 7b 22 74 79 70 65
        22 3a 22 62 6f 6f 6c 65 61 6e 22 7d a6 73 74 72
        65 61 6d c2 ab 72 6f 75 74 69 6e 67 5f 6b 65 79
        c0 ae 72 6f 75 74 65 64 5f 64 70 5f 72 61 6e 6b
        c0 ae 62 6f 6f 74 73 74 72 61 70 5f 72 6f 6f 6d
        c0 ae 72 65 74 75 72 6e 5f 6c 6f 67 70 72 6f 62
        c2 b0 74 6f 70 5f 6c 6f 67 70 72 6f 62 73 5f 6e
        75 6d 00 ab 72 65 63 65 69 76 65 64 5f 61 74 cb
        41 d9 54 fc 40 10 00 00 ac 64 69 73 70 61 74 63
        68 5f 73 65 71 03
        ",
    ),
    (
        "EmbedReq",
        "
        82 a1 76 01 a3 6d 73 67 81 a8 45 6d 62 65 64 52
        65 71 86 a3 72 69 64 a2 65 31 a9 69 6e 70 75 74
        5f 69 64 73 92 01 cd 3a c3 ab 72 6f 75 74 69 6e
        67 5f 6b 65 79 c0 ae 72 6f 75 74 65 64 5f 64 70
        5f 72 61 6e 6b 01 ab 72 65 63 65 69 76 65 64 5f
        61 74 cb 41 d9 54 fc 40 10 00 00 ac 64 69 73 70
        61 74 63 68 5f 73 65 71 07
        ",
    ),
    (
        "Abort",
        "
        82 a1 76 01 a3 6d 73 67 81 a5 41 62 6f 72 74 81
        a3 72 69 64 a2 72 31
        ",
    ),
    (
        "Abort-all",
        "
        82 a1 76 01 a3 6d 73 67 81 a5 41 62 6f 72 74 81
        a3 72 69 64 c0
        ",
    ),
    (
        "FlushCache",
        "
        82 a1 76 01 a3 6d 73 67 81 aa 46 6c 75 73 68 43
        61 63 68 65 80
        ",
    ),
    (
        "TokenOut",
        "
        82 a1 76 01 a3 6d 73 67 81 a8 54 6f 6b 65 6e 4f
        75 74 8c a3 72 69 64 a2 72 31 aa 6f 75 74 70 75
        74 5f 69 64 73 92 cd 01 c2 02 ad 66 69 6e 69 73
        68 5f 72 65 61 73 6f 6e a4 73 74 6f 70 ac 6d 61
        74 63 68 65 64 5f 73 74 6f 70 02 ad 70 72 6f 6d
        70 74 5f 74 6f 6b 65 6e 73 03 b1 63 6f 6d 70 6c
        65 74 69 6f 6e 5f 74 6f 6b 65 6e 73 02 ad 63 61
        63 68 65 64 5f 74 6f 6b 65 6e 73 01 a7 64 70 5f
        72 61 6e 6b 00 a8 6c 6f 67 70 72 6f 62 73 92 ca
        bf 00 00 00 ca be 80 00 00 ac 74 6f 70 5f 6c 6f
        67 70 72 6f 62 73 92 92 92 cd 01 c2 ca bf 00 00
        00 92 cd 06 28 ca bf c0 00 00 92 92 02 ca be 80
        00 00 92 cd 74 c1 ca c0 00 00 00 a9 65 6d 62 65
        64 64 69 6e 67 c0 a5 65 72 72 6f 72 c0
        ",
    ),
    (
        "TokenOut-error",
        "
        82 a1 76 01 a3 6d 73 67 81 a8 54 6f 6b 65 6e 4f
        75 74 8c a3 72 69 64 a2 72 32 aa 6f 75 74 70 75
        74 5f 69 64 73 90 ad 66 69 6e 69 73 68 5f 72 65
        61 73 6f 6e a5 65 72 72 6f 72 ac 6d 61 74 63 68
        65 64 5f 73 74 6f 70 c0 ad 70 72 6f 6d 70 74 5f
        74 6f 6b 65 6e 73 00 b1 63 6f 6d 70 6c 65 74 69
        6f 6e 5f 74 6f 6b 65 6e 73 00 ad 63 61 63 68 65
        64 5f 74 6f 6b 65 6e 73 00 a7 64 70 5f 72 61 6e
        6b c0 a8 6c 6f 67 70 72 6f 62 73 c0 ac 74 6f 70
        5f 6c 6f 67 70 72 6f 62 73 c0 a9 65 6d 62 65 64
        64 69 6e 67 c0 a5 65 72 72 6f 72 82 a6 73 74 61
        74 75 73 cd 01 90 a7 6d 65 73 73 61 67 65 b2 72
        61 6e 6b 20 35 20 69 73 20 6e 6f 74 20 6c 69 76
        65
        ",
    ),
    (
        "Hello",
        "
        82 a1 76 01 a3 6d 73 67 81 a5 48 65 6c 6c 6f 89
        a4 72 61 6e 6b 00 a8 63 61 70 61 63 69 74 79 84
        b0 6d 61 78 5f 74 6f 74 61 6c 5f 74 6f 6b 65 6e
        73 ce 00 01 00 00 b4 6d 61 78 5f 72 75 6e 6e 69
        6e 67 5f 72 65 71 75 65 73 74 73 40 ab 63 6f 6e
        74 65 78 74 5f 6c 65 6e cd 20 00 aa 76 6f 63 61
        62 5f 73 69 7a 65 cd 20 00 a8 6d 6f 64 65 6c 5f
        69 64 af 64 70 73 65 72 76 65 2d 62 75 69 6c 74
        69 6e b0 70 72 6f 74 6f 63 6f 6c 5f 76 65 72 73
        69 6f 6e 01 a3 70 69 64 cd 10 92 a9 68 65 6c 64
        5f 72 69 64 73 91 a2 72 31 a9 74 61 6b 65 6e 5f
        73 65 71 39 ab 63 6f 6e 73 74 72 61 69 6e 74 73
        c3 b3 66 69 6e 69 73 68 5f 66 69 72 73 74 5f 74
        6f 6b 65 6e 73 10
        ",
    ),
    (
        "Hello-prefill",
        "
        82 a1 76 01 a3 6d 73 67 81 a5 48 65 6c 6c 6f 89
        a4 72 61 6e 6b 00 a8 63 61 70 61 63 69 74 79 84
        b0 6d 61 78 5f 74 6f 74 61 6c 5f 74 6f 6b 65 6e
        73 ce 00 01 00 00 b4 6d 61 78 5f 72 75 6e 6e 69
        6e 67 5f 72 65 71 75 65 73 74 73 40 ab 63 6f 6e
        74 65 78 74 5f 6c 65 6e cd 20 00 aa 76 6f 63 61
        62 5f 73 69 7a 65 cd 20 00 a8 6d 6f 64 65 6c 5f
        69 64 af 64 70 73 65 72 76 65 2d 62 75 69 6c 74
        69 6e b0 70 72 6f 74 6f 63 6f 6c 5f 76 65 72 73
        69 6f 6e 01 a3 70 69 64 cd 10 93 a9 68 65 6c 64
        5f 72 69 64 73 90 b3 64 69 73 61 67 67 72 65 67
        61 74 69 6f 6e 5f 6d 6f 64 65 a7 70 72 65 66 69
        6c 6c ab 6b 76 5f 65 6e 64 70 6f 69 6e 74 b3 74
        63 70 3a 2f 2f 31 30 2e 30 2e 30 2e 35 3a 37 30
        31 30 a9 6b 76 5f 6c 61 79 6f 75 74 85 a8 6d 6f
        64 65 6c 5f 69 64 af 64 70 73 65 72 76 65 2d 62
        75 69 6c 74 69 6e aa 6e 75 6d 5f 6c 61 79 65 72
        73 02 ac 6e 75 6d 5f 6b 76 5f 68 65 61 64 73 04
        a8 68 65 61 64 5f 64 69 6d 40 a5 64 74 79 70 65
        a3 66 33 32
        ",
    ),
    (
        "Hello-cuda",
        "
        82 a1 76 01 a3 6d 73 67 81 a5 48 65 6c 6c 6f 87
        a4 72 61 6e 6b 01 a8 63 61 70 61 63 69 74 79 84
        b0 6d 61 78 5f 74 6f 74 61 6c 5f 74 6f 6b 65 6e
        73 ce 00 01 00 00 b4 6d 61 78 5f 72 75 6e 6e 69
        6e 67 5f 72 65 71 75 65 73 74 73 40 ab 63 6f 6e
        74 65 78 74 5f 6c 65 6e cd 20 00 aa 76 6f 63 61
        62 5f 73 69 7a 65 cd 20 00 a8 6d 6f 64 65 6c 5f
        69 64 af 64 70 73 65 72 76 65 2d 62 75 69 6c 74
        69 6e b0 70 72 6f 74 6f 63 6f 6c 5f 76 65 72 73
        69 6f 6e 01 a3 70 69 64 cd 10 94 a9 68 65 6c 64
        5f 72 69 64 73 90 a3 67 70 75 84 a7 6f 72 64 69
        6e 61 6c 01 a4 6e 61 6d 65 ab 4e 56 49 44 49 41
        20 48 32 30 30 b2 63 6f 6d 70 75 74 65 5f 63 61
        70 61 62 69 6c 69 74 79 a3 39 2e 30 b2 74 6f 74
        61 6c 5f 6d 65 6d 6f 72 79 5f 62 79 74 65 73 cf
        00 00 00 23 19 b0 00 00
        ",
    ),
    (
        "HelloAck",
        "
        82 a1 76 01 a3 6d 73 67 81 a8 48 65 6c 6c 6f 41
        63 6b 83 a4 72 61 6e 6b 00 a8 61 63 63 65 70 74
        65 64 c3 a6 72 65 61 73 6f 6e c0
        ",
    ),
    (
        "Rejoin",
        "
        82 a1 76 01 a3 6d 73 67 81 a6 52 65 6a 6f 69 6e
        81 a4 72 61 6e 6b 00
        ",
    ),
    (
        "Heartbeat",
        "
        82 a1 76 01 a3 6d 73 67 81 a9 48 65 61 72 74 62
        65 61 74 82 a4 72 61 6e 6b 00 a9 74 69 6d 65 73
        74 61 6d 70 cb 41 d9 54 fc 40 10 00 00
        ",
    ),
    (
        "WorkerStatus",
        "
        82 a1 76 01 a3 6d 73 67 81 ac 57 6f 72 6b 65 72
        53 74 61 74 75 73 8e a4 72 61 6e 6b 00 a9 74 69
        6d 65 73 74 61 6d 70 cb 41 d9 54 fc 40 10 00 00
        b0 6e 75 6d 5f 72 75 6e 6e 69 6e 67 5f 72 65 71
        73 02 b0 6e 75 6d 5f 77 61 69 74 69 6e 67 5f 72
        65 71 73 01 af 6e 75 6d 5f 75 73 65 64 5f 74 6f
        6b 65 6e 73 cd 01 2c b0 6d 61 78 5f 74 6f 74 61
        6c 5f 74 6f 6b 65 6e 73 ce 00 01 00 00 ae 63 61
        63 68 65 5f 68 69 74 5f 72 61 74 65 cb 3f d0 00
        00 00 00 00 00 ae 67 65 6e 5f 74 68 72 6f 75 67
        68 70 75 74 cb 40 5e 20 00 00 00 00 00 ad 66 69
        6e 69 73 68 65 64 5f 72 69 64 73 91 a2 72 30 af
        6e 75 6d 5f 66 72 65 65 5f 74 6f 6b 65 6e 73 cd
        fd e8 b4 6e 75 6d 5f 65 76 69 63 74 61 62 6c 65
        5f 74 6f 6b 65 6e 73 cc ec ab 6b 65 72 6e 65 6c
        5f 70 61 74 68 a4 61 76 78 32 a9 74 61 6b 65 6e
        5f 73 65 71 07 aa 73 74 61 74 75 73 5f 73 65 71
        0c
        ",
    ),
    (
        "ClusterStatus",
        "
        82 a1 76 01 a3 6d 73 67 81 ad 43 6c 75 73 74 65
        72 53 74 61 74 75 73 84 a9 74 69 6d 65 73 74 61
        6d 70 cb 41 d9 54 fc 40 10 00 00 b3 6c 6f 61 64
        5f 62 61 6c 61 6e 63 65 5f 6d 65 74 68 6f 64 af
        70 72 65 66 69 78 5f 61 66 66 69 6e 69 74 79 aa
        6c 69 76 65 5f 72 61 6e 6b 73 91 85 a4 72 61 6e
        6b 00 a8 63 61 70 61 63 69 74 79 84 b0 6d 61 78
        5f 74 6f 74 61 6c 5f 74 6f 6b 65 6e 73 ce 00 01
        00 00 b4 6d 61 78 5f 72 75 6e 6e 69 6e 67 5f 72
        65 71 75 65 73 74 73 40 ab 63 6f 6e 74 65 78 74
        5f 6c 65 6e cd 20 00 aa 76 6f 63 61 62 5f 73 69
        7a 65 cd 20 00 a8 6d 6f 64 65 6c 5f 69 64 af 64
        70 73 65 72 76 65 2d 62 75 69 6c 74 69 6e ab 6c
        61 73 74 5f 73 65 65 6e 5f 73 cb 3f e0 00 00 00
        00 00 00 a6 73 74 61 74 75 73 8e a4 72 61 6e 6b
        00 a9 74 69 6d 65 73 74 61 6d 70 cb 41 d9 54 fc
        40 10 00 00 b0 6e 75 6d 5f 72 75 6e 6e 69 6e 67
        5f 72 65 71 73 02 b0 6e 75 6d 5f 77 61 69 74 69
        6e 67 5f 72 65 71 73 01 af 6e 75 6d 5f 75 73 65
        64 5f 74 6f 6b 65 6e 73 cd 01 2c b0 6d 61 78 5f
        74 6f 74 61 6c 5f 74 6f 6b 65 6e 73 ce 00 01 00
        00 ae 63 61 63 68 65 5f 68 69 74 5f 72 61 74 65
        cb 3f d0 00 00 00 00 00 00 ae 67 65 6e 5f 74 68
        72 6f 75 67 68 70 75 74 cb 40 5e 20 00 00 00 00
        00 ad 66 69 6e 69 73 68 65 64 5f 72 69 64 73 91
        a2 72 30 af 6e 75 6d 5f 66 72 65 65 5f 74 6f 6b
        65 6e 73 cd fd e8 b4 6e 75 6d 5f 65 76 69 63 74
        61 62 6c 65 5f 74 6f 6b 65 6e 73 cc ec ab 6b 65
        72 6e 65 6c 5f 70 61 74 68 a4 61 76 78 32 a9 74
        61 6b 65 6e 5f 73 65 71 07 aa 73 74 61 74 75 73
        5f 73 65 71 0c a7 72 6f 75 74 69 6e 67 91 83 a6
        6d 65 74 68 6f 64 af 70 72 65 66 69 78 5f 61 66
        66 69 6e 69 74 79 a6 62 72 61 6e 63 68 a8 61 66
        66 69 6e 69 74 79 a5 63 6f 75 6e 74 07
        ",
    ),
    (
        "KvReady",
        "
        82 a1 76 01 a3 6d 73 67 81 a7 4b 76 52 65 61 64
        79 85 a4 72 6f 6f 6d cf 00 00 01 1f 71 fb 04 cb
        a3 72 69 64 a2 72 33 ab 64 65 63 6f 64 65 5f 72
        61 6e 6b 01 a6 6c 61 79 6f 75 74 85 a8 6d 6f 64
        65 6c 5f 69 64 af 64 70 73 65 72 76 65 2d 62 75
        69 6c 74 69 6e aa 6e 75 6d 5f 6c 61 79 65 72 73
        02 ac 6e 75 6d 5f 6b 76 5f 68 65 61 64 73 04 a8
        68 65 61 64 5f 64 69 6d 40 a5 64 74 79 70 65 a3
        66 33 32 aa 70 72 6f 6d 70 74 5f 6c 65 6e 02
        ",
    ),
    (
        "KvChunk",
        "
        82 a1 76 01 a3 6d 73 67 81 a7 4b 76 43 68 75 6e
        6b 85 a4 72 6f 6f 6d cf 00 00 01 1f 71 fb 04 cb
        a3 73 65 71 00 a5 73 74 61 72 74 00 a6 74 6f 6b
        65 6e 73 02 a5 62 79 74 65 73 cd 20 00
        ",
    ),
    (
        "KvDone",
        "
        82 a1 76 01 a3 6d 73 67 81 a6 4b 76 44 6f 6e 65
        88 a4 72 6f 6f 6d cf 00 00 01 1f 71 fb 04 cb a6
        63 68 75 6e 6b 73 01 ab 66 69 72 73 74 5f 74 6f
        6b 65 6e cd 01 c2 a7 6c 6f 67 70 72 6f 62 ca bf
        00 00 00 ac 74 6f 70 5f 6c 6f 67 70 72 6f 62 73
        c0 ad 63 61 63 68 65 64 5f 74 6f 6b 65 6e 73 00
        ad 66 69 6e 69 73 68 5f 72 65 61 73 6f 6e c0 ac
        6d 61 74 63 68 65 64 5f 73 74 6f 70 c0
        ",
    ),
    (
        "KvAbort",
        "
        82 a1 76 01 a3 6d 73 67 81 a7 4b 76 41 62 6f 72
        74 83 a4 72 6f 6f 6d cf 00 00 01 1f 71 fb 04 cb
        a6 73 74 61 74 75 73 cd 01 f7 a6 72 65 61 73 6f
        6e d9 23 4b 56 20 62 6f 6f 74 73 74 72 61 70 20
        74 69 6d 65 64 20 6f 75 74 20 61 66 74 65 72 20
        33 30 30 2e 30 73
        ",
    ),
    (
        "PeerGone",
        "
        82 a1 76 01 a3 6d 73 67 81 a8 50 65 65 72 47 6f
        6e 65 82 a4 72 61 6e 6b 00 a6 72 65 61 73 6f 6e
        bd 69 74 20 73 74 6f 70 70 65 64 20 73 65 6e 64
        69 6e 67 20 68 65 61 72 74 62 65 61 74 73
        ",
    ),
    (
        "KvEvents",
        "
        82 a1 76 01 a3 6d 73 67 81 a8 4b 76 45 76 65 6e
        74 73 86 a4 72 61 6e 6b 00 a3 73 65 71 07 aa 62
        6c 6f 63 6b 5f 73 69 7a 65 20 a7 63 6c 65 61 72
        65 64 c2 a7 72 65 6d 6f 76 65 64 91 cf 6f c1 eb
        d4 f4 d6 ea 31 a6 73 74 6f 72 65 64 91 cf e3 13
        56 ba 2d a6 54 a2
        ",
    ),
    (
        "KvEvents-snapshot",
        "
        82 a1 76 01 a3 6d 73 67 81 a8 4b 76 45 76 65 6e
        74 73 86 a4 72 61 6e 6b 01 a3 73 65 71 01 aa 62
        6c 6f 63 6b 5f 73 69 7a 65 20 a7 63 6c 65 61 72
        65 64 c3 a7 72 65 6d 6f 76 65 64 90 a6 73 74 6f
        72 65 64 92 cf 6f c1 eb d4 f4 d6 ea 31 cf e3 13
        56 ba 2d a6 54 a2
        ",
    ),
    (
        "KvSnapshotReq",
        "
        82 a1 76 01 a3 6d 73 67 81 ad 4b 76 53 6e 61 70
        73 68 6f 74 52 65 71 81 a4 72 61 6e 6b 01
        ",
    ),
    (
        "Reconcile",
        "
        82 a1 76 01 a3 6d 73 67 81 a9 52 65 63 6f 6e 63
        69 6c 65 81 a4 72 69 64 73 92 a2 72 31 a5 72 65
        71 2d 37
        ",
    ),
    (
        "Shutdown",
        "
        82 a1 76 01 a3 6d 73 67 81 a8 53 68 75 74 64 6f
        77 6e 83 a4 72 61 6e 6b 00 a6 72 65 61 73 6f 6e
        a7 73 69 67 74 65 72 6d af 64 72 61 69 6e 5f 74
        69 6d 65 6f 75 74 5f 73 cb 40 3e 00 00 00 00 00
        00
        ",
    ),
];

#[test]
fn golden_frames_encode_exactly_and_decode_back() {
    let examples = examples();
    assert_eq!(
        examples.len(),
        GOLDEN.len(),
        "one golden vector per example"
    );
    for ((name, msg), (golden_name, hex)) in examples.iter().zip(GOLDEN) {
        assert_eq!(
            name, golden_name,
            "examples and GOLDEN are in the same order"
        );
        let expected = from_hex(hex);
        let frame = encode(msg).unwrap();
        assert!(
            frame == expected,
            "{name}: encoder output changed; new bytes:\n{}",
            to_hex_lines(&frame)
        );
        assert_eq!(&decode(&expected).unwrap(), msg, "{name}: decode(golden)");
    }
}

/// The variant index, by an exhaustive match: a new message type fails to compile here until it
/// gets a golden example.
fn variant_index(msg: &Message) -> usize {
    match msg {
        Message::GenerateReq(_) => 0,
        Message::EmbedReq(_) => 1,
        Message::Abort(_) => 2,
        Message::FlushCache(_) => 3,
        Message::TokenOut(_) => 4,
        Message::Hello(_) => 5,
        Message::HelloAck(_) => 6,
        Message::Heartbeat(_) => 7,
        Message::WorkerStatus(_) => 8,
        Message::ClusterStatus(_) => 9,
        Message::Shutdown(_) => 10,
        Message::Rejoin(_) => 11,
        Message::KvReady(_) => 12,
        Message::KvChunk(_) => 13,
        Message::KvDone(_) => 14,
        Message::KvAbort(_) => 15,
        Message::PeerGone(_) => 16,
        Message::KvEvents(_) => 17,
        Message::KvSnapshotReq(_) => 18,
        Message::Reconcile(_) => 19,
    }
}

#[test]
fn every_message_type_has_a_golden_vector() {
    let mut covered = [false; 20];
    for (_, msg) in examples() {
        covered[variant_index(&msg)] = true;
    }
    assert!(covered.iter().all(|&c| c), "covered: {covered:?}");
}

// ---- helpers: frames as a peer in another language would build them ----

/// A frame as a `serde_json::Value` (keys sorted, floats widened to f64: both are legal on the
/// wire, which is the point of the tests that use it).
fn to_value(frame: &[u8]) -> Value {
    rmp_serde::from_slice(frame).expect("frame is a MessagePack value")
}

fn to_frame(value: &Value) -> Vec<u8> {
    rmp_serde::to_vec_named(value).unwrap()
}

fn golden_value(name: &str) -> (Message, Value) {
    let (_, msg) = examples()
        .into_iter()
        .find(|(n, _)| *n == name)
        .expect("example exists");
    let value = to_value(&encode(&msg).unwrap());
    (msg, value)
}

/// The body map of a frame's message: `frame["msg"][<Type>]`.
fn body_mut<'a>(value: &'a mut Value, kind: &str) -> &'a mut serde_json::Map<String, Value> {
    value["msg"][kind].as_object_mut().expect("body is a map")
}

fn is_malformed(result: &Result<Message, DecodeError>) -> bool {
    matches!(result, Err(DecodeError::Malformed { .. }))
}

// ---- forward compatibility ----

#[test]
fn unknown_fields_are_ignored_at_every_level() {
    for (name, msg) in examples() {
        let kind = msg.type_name();
        let mut value = to_value(&encode(&msg).unwrap());
        value["trace_id"] = json!("abc");
        value["hops"] = json!([1, {"deep": [null, 2.5]}]);
        body_mut(&mut value, kind).insert("added_in_v1_9".into(), json!({"x": [1, 2, 3]}));
        body_mut(&mut value, kind).insert("priority".into(), json!(-3));
        // Nested structs ignore unknown fields too.
        for nested in ["sampling", "capacity", "error"] {
            if let Some(Value::Object(map)) = body_mut(&mut value, kind).get_mut(nested) {
                map.insert("newer".into(), json!(true));
            }
        }
        if let Some(Value::Array(ranks)) = body_mut(&mut value, kind).get_mut("live_ranks") {
            for rank in ranks {
                rank["newer"] = json!("x");
                rank["status"]["newer"] = json!(1.5);
            }
        }
        assert_eq!(decode(&to_frame(&value)).unwrap(), msg, "{name}");
    }
}

/// Which body fields a peer must send, and what a missing optional field decodes to.
struct FieldRules {
    kind: &'static str,
    required: &'static [&'static str],
    /// Field and the JSON of its default. `"<sampling default>"` stands for
    /// `SamplingParams::default()`, so the defaults keep one source of truth.
    optional: &'static [(&'static str, &'static str)],
}

const FIELD_RULES: &[FieldRules] = &[
    FieldRules {
        kind: "KvReady",
        required: &["room", "rid", "decode_rank", "layout", "prompt_len"],
        optional: &[],
    },
    FieldRules {
        kind: "KvChunk",
        required: &["room", "seq", "start", "tokens", "bytes"],
        optional: &[],
    },
    FieldRules {
        kind: "KvDone",
        required: &["room", "chunks"],
        optional: &[
            ("first_token", "null"),
            ("logprob", "null"),
            ("top_logprobs", "null"),
            ("cached_tokens", "0"),
            ("finish_reason", "null"),
            ("matched_stop", "null"),
        ],
    },
    FieldRules {
        kind: "KvAbort",
        required: &["room", "status", "reason"],
        optional: &[],
    },
    FieldRules {
        kind: "PeerGone",
        required: &["rank", "reason"],
        optional: &[],
    },
    FieldRules {
        kind: "KvEvents",
        required: &["rank", "seq", "block_size"],
        optional: &[("cleared", "false"), ("removed", "[]"), ("stored", "[]")],
    },
    FieldRules {
        kind: "KvSnapshotReq",
        required: &["rank"],
        optional: &[],
    },
    FieldRules {
        kind: "Reconcile",
        required: &["rids"],
        optional: &[],
    },
    FieldRules {
        kind: "GenerateReq",
        required: &["rid", "input_ids"],
        optional: &[
            ("sampling", "\"<sampling default>\""),
            ("stream", "false"),
            ("routing_key", "null"),
            ("routed_dp_rank", "null"),
            ("bootstrap_room", "null"),
            ("return_logprob", "false"),
            ("top_logprobs_num", "0"),
            ("received_at", "0.0"),
            ("dispatch_seq", "0"),
            // Absent (not null) when unset, as every field added with skip_serializing_if.
            ("disagg", "null"),
        ],
    },
    FieldRules {
        kind: "EmbedReq",
        required: &["rid", "input_ids"],
        optional: &[
            ("routing_key", "null"),
            ("routed_dp_rank", "null"),
            ("received_at", "0.0"),
            ("dispatch_seq", "0"),
        ],
    },
    FieldRules {
        kind: "Abort",
        required: &[],
        optional: &[("rid", "null")],
    },
    FieldRules {
        kind: "FlushCache",
        required: &[],
        optional: &[],
    },
    FieldRules {
        kind: "TokenOut",
        required: &["rid"],
        optional: &[
            ("output_ids", "[]"),
            ("finish_reason", "null"),
            ("matched_stop", "null"),
            ("prompt_tokens", "0"),
            ("completion_tokens", "0"),
            ("cached_tokens", "0"),
            ("dp_rank", "null"),
            ("logprobs", "null"),
            ("top_logprobs", "null"),
            ("embedding", "null"),
            ("error", "null"),
        ],
    },
    FieldRules {
        kind: "Hello",
        required: &["rank", "capacity", "model_id"],
        optional: &[
            ("protocol_version", "0"),
            ("pid", "0"),
            ("held_rids", "[]"),
            ("disaggregation_mode", "null"),
            ("kv_endpoint", "null"),
            ("kv_layout", "null"),
            ("gpu", "null"),
            ("taken_seq", "null"),
            // False: absent from the wire.
            ("constraints", "null"),
            // 0: absent from the wire.
            ("finish_first_tokens", "null"),
        ],
    },
    FieldRules {
        kind: "HelloAck",
        required: &["rank", "accepted"],
        optional: &[("reason", "null")],
    },
    FieldRules {
        kind: "Rejoin",
        required: &["rank"],
        optional: &[],
    },
    FieldRules {
        kind: "Heartbeat",
        required: &["rank", "timestamp"],
        optional: &[],
    },
    FieldRules {
        kind: "WorkerStatus",
        required: &[
            "rank",
            "timestamp",
            "num_running_reqs",
            "num_waiting_reqs",
            "num_used_tokens",
            "max_total_tokens",
            "cache_hit_rate",
            "gen_throughput",
        ],
        optional: &[
            ("finished_rids", "[]"),
            ("num_free_tokens", "0"),
            ("num_evictable_tokens", "0"),
            ("kernel_path", "\"\""),
            ("taken_seq", "null"),
            ("disagg", "null"),
            ("status_seq", "null"),
            ("prefill", "null"),
            ("invariant_violations", "[]"),
        ],
    },
    FieldRules {
        kind: "ClusterStatus",
        required: &["timestamp", "load_balance_method", "live_ranks"],
        optional: &[
            ("routing", "[]"),
            ("controller_id", "null"),
            ("regret", "[]"),
        ],
    },
    FieldRules {
        kind: "Shutdown",
        required: &[],
        optional: &[
            ("rank", "null"),
            ("reason", "\"\""),
            ("drain_timeout_s", "null"),
        ],
    },
];

fn default_json(text: &str) -> Value {
    if text == "\"<sampling default>\"" {
        serde_json::to_value(SamplingParams::default()).unwrap()
    } else {
        serde_json::from_str(text).unwrap()
    }
}

/// Removing a required field makes the frame `Malformed` (naming the field); removing an
/// optional one decodes to its default. Every field of every example is in the table, so a new
/// field cannot slip in without a decision (and a line in `WIRE.md`).
#[test]
fn missing_fields_are_malformed_or_default_as_documented() {
    for (name, msg) in examples() {
        let kind = msg.type_name();
        let rules = FIELD_RULES.iter().find(|r| r.kind == kind).unwrap();
        let full = to_value(&encode(&msg).unwrap());
        let fields: Vec<String> = full["msg"][kind]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        // Every required field is sent; optional ones added with `skip_serializing_if` may be
        // absent (each field that is sent must be in the table, below).
        for required in rules.required {
            assert!(
                fields.iter().any(|f| f == required),
                "{name}: required field {required} not sent ({fields:?})"
            );
        }

        for field in &fields {
            let mut value = full.clone();
            body_mut(&mut value, kind).remove(field);
            let result = decode(&to_frame(&value));
            if rules.required.contains(&field.as_str()) {
                match &result {
                    Err(DecodeError::Malformed { reason, .. }) => {
                        assert!(reason.contains(field.as_str()), "{name}.{field}: {reason}")
                    }
                    other => panic!("{name} without {field}: {other:?}, want Malformed"),
                }
            } else {
                let (_, default) = rules
                    .optional
                    .iter()
                    .find(|(f, _)| f == field)
                    .unwrap_or_else(|| panic!("{name}.{field} is in neither list"));
                let decoded = result.unwrap_or_else(|e| panic!("{name} without {field}: {e}"));
                let decoded = serde_json::to_value(&decoded).unwrap();
                assert_eq!(
                    decoded[kind][field],
                    default_json(default),
                    "{name}.{field}"
                );
            }
        }
    }
}

#[test]
fn nested_required_fields_are_enforced() {
    let cases: &[(&str, &[&str], &str)] = &[
        ("Hello", &["capacity"], "max_total_tokens"),
        ("Hello", &["capacity"], "max_running_requests"),
        ("Hello-cuda", &["gpu"], "ordinal"),
        ("Hello-cuda", &["gpu"], "name"),
        ("Hello-cuda", &["gpu"], "compute_capability"),
        ("Hello-cuda", &["gpu"], "total_memory_bytes"),
        ("TokenOut-error", &["error"], "status"),
        ("TokenOut-error", &["error"], "message"),
        ("ClusterStatus", &["live_ranks", "0"], "rank"),
        ("ClusterStatus", &["live_ranks", "0"], "capacity"),
        ("ClusterStatus", &["live_ranks", "0"], "model_id"),
        ("ClusterStatus", &["live_ranks", "0"], "last_seen_s"),
        ("ClusterStatus", &["live_ranks", "0", "status"], "rank"),
        ("ClusterStatus", &["routing", "0"], "method"),
        ("ClusterStatus", &["routing", "0"], "branch"),
        ("ClusterStatus", &["routing", "0"], "count"),
    ];
    for (name, path, field) in cases {
        let (msg, mut value) = golden_value(name);
        let mut node = &mut value["msg"][msg.type_name()];
        for step in *path {
            node = match step.parse::<usize>() {
                Ok(i) => &mut node[i],
                Err(_) => &mut node[*step],
            };
        }
        node.as_object_mut()
            .unwrap()
            .remove(*field)
            .expect("field present");
        let result = decode(&to_frame(&value));
        assert!(
            is_malformed(&result),
            "{name} {path:?} without {field}: {result:?}"
        );
    }
}

#[test]
fn nested_optional_fields_default() {
    // Capacity: context_len and vocab_size; RankInfo: status.
    let (msg, mut value) = golden_value("ClusterStatus");
    let rank = &mut value["msg"][msg.type_name()]["live_ranks"][0];
    rank.as_object_mut().unwrap().remove("status");
    let capacity = rank["capacity"].as_object_mut().unwrap();
    capacity.remove("context_len");
    capacity.remove("vocab_size");
    let Message::ClusterStatus(cs) = decode(&to_frame(&value)).unwrap() else {
        panic!("not a ClusterStatus")
    };
    assert_eq!(cs.live_ranks[0].status, None);
    assert_eq!(cs.live_ranks[0].capacity.context_len, 0);
    assert_eq!(cs.live_ranks[0].capacity.vocab_size, 0);
}

/// `Hello.gpu` and `RankInfo.gpu` between old and new peers: a worker that predates the field
/// (or a CPU one) sends none and decodes as `None`; a GPU worker's `Hello` round-trips, and an
/// older peer reading it ignores the map (rule 1); the controller's `RankInfo` carries it the
/// same way.
#[test]
fn gpu_identity_is_optional_both_ways() {
    let (cpu, value) = golden_value("Hello");
    assert!(
        value["msg"]["Hello"].get("gpu").is_none(),
        "None is not sent"
    );
    let Message::Hello(cpu) = cpu else {
        panic!("not a Hello")
    };
    assert_eq!(cpu.gpu, None);

    let (cuda, value) = golden_value("Hello-cuda");
    assert_eq!(
        value["msg"]["Hello"]["gpu"],
        json!({
            "ordinal": 1,
            "name": "NVIDIA H200",
            "compute_capability": "9.0",
            "total_memory_bytes": 150_754_820_096u64,
        })
    );
    assert_eq!(decode(&encode(&cuda).unwrap()).unwrap(), cuda);
    // The GPU worker's frame less its `gpu` is exactly what an older worker would send.
    let mut older = value.clone();
    body_mut(&mut older, "Hello").remove("gpu");
    let Message::Hello(older) = decode(&to_frame(&older)).unwrap() else {
        panic!("not a Hello")
    };
    let Message::Hello(cuda) = cuda else {
        panic!("not a Hello")
    };
    assert_eq!(older.gpu, None);
    assert_eq!(older.rank, cuda.rank);

    // RankInfo: absent in the golden ClusterStatus; present, it round-trips.
    let (status, value) = golden_value("ClusterStatus");
    assert!(value["msg"]["ClusterStatus"]["live_ranks"][0]
        .get("gpu")
        .is_none());
    let Message::ClusterStatus(mut status) = status else {
        panic!("not a ClusterStatus")
    };
    assert_eq!(status.live_ranks[0].gpu, None);
    status.live_ranks[0].gpu = cuda.gpu.clone();
    let msg = Message::ClusterStatus(status);
    assert_eq!(decode(&encode(&msg).unwrap()).unwrap(), msg);
}

/// What a minimal Python peer sends: only required fields, Python ints where Rust has floats,
/// f64 where Rust has f32, and a partial `sampling` map.
#[test]
fn minimal_frames_from_other_languages_decode_with_defaults() {
    let frame = to_frame(&json!({
        "v": 1,
        "msg": {"GenerateReq": {
            "rid": "py-1",
            "input_ids": [1, 2, 3],
            "sampling": {"temperature": 0, "top_p": 0.9, "max_new_tokens": 8},
            "received_at": 1700000000,
        }},
    }));
    let Message::GenerateReq(req) = decode(&frame).unwrap() else {
        panic!("not a GenerateReq")
    };
    let expected = GenerateReq {
        rid: "py-1".into(),
        input_ids: vec![1, 2, 3],
        sampling: SamplingParams {
            max_new_tokens: 8,
            temperature: 0.0,
            top_p: 0.9,
            ..SamplingParams::default()
        },
        stream: false,
        routing_key: None,
        routed_dp_rank: None,
        bootstrap_room: None,
        return_logprob: false,
        top_logprobs_num: 0,
        received_at: 1_700_000_000.0,
        dispatch_seq: 0,
        disagg: None,
        submission_seq: None,
        return_routing: false,
        routing: Vec::new(),
    };
    assert_eq!(req, expected);

    let frame = to_frame(&json!({"v": 1, "msg": {"Shutdown": {}}}));
    assert_eq!(
        decode(&frame).unwrap(),
        Message::Shutdown(Shutdown {
            rank: None,
            reason: String::new(),
            drain_timeout_s: None,
        })
    );
    let frame = to_frame(&json!({"v": 1, "msg": {"FlushCache": {}}}));
    assert_eq!(decode(&frame).unwrap(), Message::FlushCache(FlushCache {}));
}

// ---- errors: unknown type, other version, garbage ----

#[test]
fn unknown_type_is_reported_by_name() {
    let frame = to_frame(&json!({"v": 1, "msg": {"KvTransfer": {"rid": "r1", "pages": [1, 2]}}}));
    assert_eq!(
        decode(&frame),
        Err(DecodeError::UnknownType {
            name: "KvTransfer".into()
        })
    );
    // A body that is not even a map does not change the verdict: the type is what is unknown.
    let frame = to_frame(&json!({"v": 1, "msg": {"Ping": null}}));
    assert_eq!(
        decode(&frame),
        Err(DecodeError::UnknownType {
            name: "Ping".into()
        })
    );
}

#[test]
fn other_versions_are_refused() {
    for (name, msg) in examples() {
        for v in [0, 2, 7] {
            let frame = encode_envelope(&Envelope {
                v,
                msg: msg.clone(),
            })
            .unwrap();
            assert_eq!(
                decode(&frame),
                Err(DecodeError::Version { got: v }),
                "{name} v{v}"
            );
        }
    }
    // A v2 frame of a type v1 has never heard of is still a version mismatch, not an unknown type.
    let frame = to_frame(&json!({"v": 2, "msg": {"KvTransfer": {}}}));
    assert_eq!(decode(&frame), Err(DecodeError::Version { got: 2 }));
    // Same for a v2 body whose known type changed shape.
    let frame = to_frame(&json!({"v": 2, "msg": {"Abort": {"rid": [1, 2]}}}));
    assert_eq!(decode(&frame), Err(DecodeError::Version { got: 2 }));
}

#[test]
fn known_type_with_a_bad_field_is_malformed() {
    let bad_bodies = [
        json!({"GenerateReq": {"rid": 5, "input_ids": [1]}}),
        json!({"GenerateReq": {"rid": "r", "input_ids": [-1]}}),
        json!({"GenerateReq": {"rid": "r", "input_ids": "1 2 3"}}),
        json!({"TokenOut": {"rid": "r", "finish_reason": "exploded"}}),
        json!({"Heartbeat": {"rank": 4294967296u64, "timestamp": 0.0}}),
        json!({"FlushCache": null}),
        json!({"Abort": "r1"}),
    ];
    for msg in bad_bodies {
        let frame = to_frame(&json!({"v": 1, "msg": msg}));
        let result = decode(&frame);
        assert!(is_malformed(&result), "{msg}: {result:?}");
    }
}

#[test]
fn frames_that_are_not_envelopes_are_malformed() {
    let mut frames: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xc1], // the one byte MessagePack never uses
        b"hello".to_vec(),
        b"{\"v\":1}".to_vec(),
    ];
    for value in [
        json!(null),
        json!(1),
        json!("GenerateReq"),
        json!({}),
        json!({"msg": {"Abort": {"rid": "r"}}}),
        json!({"v": 1}),
        json!({"v": "1", "msg": {"Abort": {}}}),
        json!({"v": -1, "msg": {"Abort": {}}}),
        json!({"v": 1, "msg": {}}),
        json!({"v": 1, "msg": {"Abort": {}, "FlushCache": {}}}),
        json!({"v": 1, "msg": ["Abort", {}]}),
        json!({"v": 1, "msg": null}),
    ] {
        frames.push(to_frame(&value));
    }
    // A valid frame with a byte glued after it, and an envelope as a positional array.
    let mut glued = protocol::encode(&examples()[0].1).unwrap();
    glued.push(0xc0);
    frames.push(glued);
    frames.push(to_frame(&json!([1, {"Abort": {"rid": "r"}}])));
    for frame in frames {
        let result = decode(&frame);
        match result {
            Err(DecodeError::Malformed { len, .. }) => assert_eq!(len, frame.len()),
            other => panic!("{}: {other:?}, want Malformed", to_hex_lines(&frame)),
        }
    }
}
