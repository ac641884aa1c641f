//! Reading dpserve's traces back and drawing them: what `dpserve trace` shows and `dpserve bench`
//! draws. Offline only: nothing here runs inside an actor. The actors write the traces
//! (`controller::trace` the routing trace, `protocol::msg_trace` the message traces); the record
//! and line types they share with this crate are the protocol crate's
//! (`protocol::route_record`, `protocol::trace_event`).
//!
//! - Reading: [`report`] summarises and explains routing records (with [`scores`] for the peer
//!   methods' terms); [`timeline`] merges the actors' message traces into one request's
//!   timeline.
//! - Pictures: [`journey`] turns a timeline into lanes, arrows and marks that [`picture`] draws
//!   as SVG; [`traffic`] counts and draws routing over a run; [`chrome`] writes either as Chrome
//!   trace-event JSON; [`bars`] draws bar panels (the bench's comparison chart), [`lines`] a
//!   line panel (the bench's capacity sweep). All SVG goes through [`svg`].

pub mod bars;
pub mod chrome;
#[cfg(test)]
mod fixtures;
pub mod journey;
pub mod lines;
pub mod picture;
pub mod report;
mod scores;
pub mod svg;
pub mod timeline;
pub mod traffic;
