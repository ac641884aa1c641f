//! Token sampling (placeholder until it lands).
