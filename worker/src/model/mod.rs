//! Llama model (placeholder until the model lands).
