//! CPU kernels (placeholder until they land).
