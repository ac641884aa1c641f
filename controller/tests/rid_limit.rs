//! The controller refuses a request whose rid breaks the one rid limit
//! ([`protocol::MAX_RID_LEN`]) with a 400 to the tokenizer, and routes one at the limit.

mod common;

use controller::Method;
use protocol::{GenerateReq, Message, MAX_RID_LEN};

fn request(rid: String) -> Message {
    Message::GenerateReq(GenerateReq::new(rid, vec![1, 2, 3]))
}

#[test]
fn a_rid_over_the_limit_is_a_400_and_one_at_the_limit_is_routed() {
    let c = common::start(Method::RoundRobin);
    let long = "x".repeat(MAX_RID_LEN + 1);
    c.send(&request(long.clone()));
    let out = c.next_out();
    assert_eq!(out.rid, long);
    let err = out.error.expect("an error");
    assert_eq!(err.status, 400, "{err:?}");
    assert!(err.message.contains(&MAX_RID_LEN.to_string()), "{err:?}");

    // At the limit it is routed: with no rank live that is the 503 of routing, not a 400.
    let at_limit = "y".repeat(MAX_RID_LEN);
    c.send(&request(at_limit.clone()));
    let out = c.next_out();
    assert_eq!(out.rid, at_limit);
    assert_eq!(out.error.expect("no rank live").status, 503);

    c.stop();
}
