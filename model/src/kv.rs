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

    /// `num_slots` slots that store nothing: a simulated rank's pool, whose slots are only
    /// bookkeeping (its KV payloads between workers are empty).
    pub fn empty(num_slots: usize) -> Self {
        KvBuffers {
            k: Vec::new(),
            v: Vec::new(),
            row: 0,
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

    /// Every layer's K buffer, then every layer's V buffer, `num_slots` rows each (the worker's
    /// tests of what a pool costs in resident memory).
    pub fn buffers_mut(&mut self) -> impl Iterator<Item = &mut [f32]> {
        self.k.iter_mut().chain(&mut self.v).map(|b| &mut b[..])
    }

    /// Whether these buffers were made for a model of this shape.
    pub(crate) fn fits(&self, config: &ModelConfig) -> bool {
        self.k.len() == config.num_hidden_layers && self.row == config.kv_dim()
    }
}

impl KvBuffers {
    /// The KV of `slots` (in order) as they travel between workers: for each layer, K of every
    /// slot then V of every slot, each value little-endian f32.
    pub fn read_slots(&self, slots: &[u32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.k.len() * 2 * slots.len() * self.row * 4);
        for (k, v) in self.k.iter().zip(&self.v) {
            for buf in [k, v] {
                for &s in slots {
                    let at = s as usize * self.row;
                    out.extend_from_slice(&le_bytes(&buf[at..at + self.row]));
                }
            }
        }
        out
    }

    /// Writes what [`Self::read_slots`] produced into `slots`; false (nothing written) when the
    /// payload's size is not that of `slots` in this layout, or a slot is outside the pool.
    pub fn write_slots(&mut self, slots: &[u32], payload: &[u8]) -> bool {
        let want = self.k.len() * 2 * slots.len() * self.row * 4;
        if payload.len() != want || slots.iter().any(|&s| s as usize >= self.num_slots) {
            return false;
        }
        let mut bytes = payload;
        for (k, v) in self.k.iter_mut().zip(self.v.iter_mut()) {
            for buf in [k, v] {
                for &s in slots {
                    let at = s as usize * self.row;
                    let (row, rest) = bytes.split_at(self.row * 4);
                    bytes = rest;
                    from_le_bytes(row, &mut buf[at..at + self.row]);
                }
            }
        }
        true
    }
}

/// `row` as little-endian bytes: its memory as is on little-endian targets.
fn le_bytes(row: &[f32]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: f32 has no padding and u8 has no invalid values or alignment; the byte slice
        // covers exactly the row's memory and lives as long as the borrow of `row`.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(row.as_ptr().cast::<u8>(), std::mem::size_of_val(row))
        })
    } else {
        std::borrow::Cow::Owned(row.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
}

/// Little-endian `bytes` (4 per value) into `row`.
fn from_le_bytes(bytes: &[u8], row: &mut [f32]) {
    debug_assert_eq!(bytes.len(), row.len() * 4);
    if cfg!(target_endian = "little") {
        // SAFETY: `row` covers exactly `bytes.len()` bytes (asserted by the caller's size
        // check), every bit pattern is a valid f32, and the two do not overlap (one is the
        // payload, the other the pool).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                row.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            )
        }
    } else {
        for (x, b) in row.iter_mut().zip(bytes.chunks_exact(4)) {
            *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
}
