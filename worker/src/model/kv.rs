//! The KV slot pool's storage: per layer one K and one V buffer of `[num_slots, kv_heads,
//! head_dim]` f32. Which slot belongs to which token is the scheduler's business, not this one's.

use kernels::LineVec;

use super::config::ModelConfig;

/// K and V of every layer for `num_slots` token slots.
pub struct KvBuffers {
    /// Line-aligned, so a head's 64-float row never straddles two cache lines.
    pub(crate) k: Vec<LineVec>,
    pub(crate) v: Vec<LineVec>,
    pub(crate) row: usize,
    num_slots: usize,
}

impl KvBuffers {
    /// Zeroed buffers (the allocator hands out pages lazily, so a large pool is cheap until used).
    pub fn new(config: &ModelConfig, num_slots: usize) -> Self {
        let row = config.kv_dim();
        let layer = || LineVec::zeroed(num_slots * row);
        KvBuffers {
            k: (0..config.num_hidden_layers).map(|_| layer()).collect(),
            v: (0..config.num_hidden_layers).map(|_| layer()).collect(),
            row,
            num_slots,
        }
    }

    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    /// Bytes one token slot costs across all layers (K and V), for sizing the pool.
    pub fn bytes_per_slot(config: &ModelConfig) -> usize {
        config.num_hidden_layers * 2 * config.kv_dim() * std::mem::size_of::<f32>()
    }

    /// Whether these buffers were made for a model of this shape.
    pub(crate) fn fits(&self, config: &ModelConfig) -> bool {
        self.k.len() == config.num_hidden_layers && self.row == config.kv_dim()
    }
}
