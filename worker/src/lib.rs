//! The worker actor: one data-parallel rank. It owns a device, its KV pool, the request pools,
//! the scheduler and the model, and talks to the controller (DEALER) and the tokenizer (PUSH).

pub mod model;
pub mod sampling;
