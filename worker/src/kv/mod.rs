//! Where a rank's KV lives: the slot allocator ([`alloc`]), the request-to-token rows
//! ([`req_to_token`]), the radix cache over them ([`radix_cache`]), the events that tell the
//! controller what the cache holds ([`events`]), and [`memory`], which keeps the four
//! consistent for the scheduler. The K/V buffers themselves are the model's
//! ([`crate::model::KvBuffers`]).

pub mod alloc;
pub mod events;
pub mod memory;
pub mod radix_cache;
pub mod req_to_token;
