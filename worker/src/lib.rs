//! The worker actor: one data-parallel rank. It owns a device, its KV pool, the scheduler and
//! the model, and talks to the controller (DEALER, through [`link`]) and the tokenizer (PUSH).
//!
//! Threads: the main thread runs the actor ([`actor`]: the scheduler and its KV memory) and owns
//! the PUSH socket to the tokenizer and the inproc end of the outbox; the link thread owns the
//! DEALER. Model compute runs on a rayon pool of `--num-threads` threads. [`startup`] sets the
//! worker up (model, pool sizing, sockets, link) and runs the actor's loop.

pub mod actor;
pub mod args;
pub mod clock;
pub mod disagg;
pub mod error;
pub mod gpu_identity;
pub mod kv;
pub mod link;
pub mod mem;
pub use model;
pub mod model_runner;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod sim;
pub mod startup;
pub mod step_budget;

pub use args::{
    Device, DeviceArgs, ModelArgs, ModelSource, ServeArgs, SimSettings, WorkerArgs, WorkerConfig,
};
pub use error::{RequestError, WorkerError};
pub use startup::{load_model, run};
