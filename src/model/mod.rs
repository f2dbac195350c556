//! The engine as a service: GGUF files, tokenizer, chat template, forward pass, sampler, session,
//! synthetic models, and the worker thread with its command/event protocol.

pub mod bound;
pub mod config;
pub mod forward;
pub mod gguf;
pub mod loader;
pub mod protocol;
pub mod reasoning;
pub mod remote;
pub mod sampler;
pub mod scheduler;
pub mod session;
pub mod split;
pub mod synthetic;
pub mod template;
pub mod tokenizer;
pub mod untrusted;
pub mod worker;
