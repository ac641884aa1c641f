//! Request-to-token pool: one table of `rows × context_len` KV slot indices, allocated once at
//! start. A request holds one row while its KV is held (admitted, or on a decode worker while
//! its KV arrives); row `r`, column `p` is the KV slot of position `p` of that request, which is
//! what the model reads attention from.
//!
//! Rows are handed out from a free list (O(1) alloc and free, no per-request allocation). A
//! held flag per row makes a double free (or a row the pool never had) a refusal in every
//! build: counted and returned as an error, never pushed onto the free list a second time,
//! where one row would then be handed to two requests.
//!
//! A decode worker, and only it, has `pre_alloc` extra rows beyond `--max-running-requests`
//! (`--decode-prealloc-size`, as SGLang's `DecodeReqToTokenPool`): requests in its
//! pre-allocation, transfer and ready queues hold a row and their prompt's slots without
//! running. Its scheduler never lets more than `max_running_requests` requests run, so the extra
//! rows never raise the running cap. Unified and prefill workers have exactly
//! `max_running_requests` rows.

use std::fmt;
use std::str::FromStr;

use protocol::DisaggMode;

use crate::error::RowFreeError;

/// `--decode-prealloc-size`: `auto` or a row count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodePrealloc {
    /// As SGLang's decode pool: `2 × max_running_requests` when that is at most 32, else 0.
    #[default]
    Auto,
    Rows(usize),
}

/// Largest running cap for which `auto` adds pre-allocated rows.
const AUTO_PREALLOC_MAX_RUNNING: usize = 32;
/// Pre-allocated rows per running row under `auto`.
const AUTO_PREALLOC_FACTOR: usize = 2;

impl DecodePrealloc {
    /// The extra rows of a worker in `mode`: none but on a decode worker, as SGLang's
    /// `DecodeReqToTokenPool` (only the decode role has requests that hold KV without
    /// running; elsewhere the rows would go unused and only widen the KV pool's bound).
    pub fn rows(self, mode: DisaggMode, max_running_requests: usize) -> usize {
        if mode != DisaggMode::Decode {
            return 0;
        }
        match self {
            DecodePrealloc::Auto if max_running_requests <= AUTO_PREALLOC_MAX_RUNNING => {
                AUTO_PREALLOC_FACTOR * max_running_requests
            }
            DecodePrealloc::Auto => 0,
            DecodePrealloc::Rows(n) => n,
        }
    }
}

impl FromStr for DecodePrealloc {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(DecodePrealloc::Auto);
        }
        s.parse::<usize>()
            .map(DecodePrealloc::Rows)
            .map_err(|_| format!("expected `auto` or a row count, got {s:?}"))
    }
}

impl fmt::Display for DecodePrealloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodePrealloc::Auto => f.write_str("auto"),
            DecodePrealloc::Rows(n) => write!(f, "{n}"),
        }
    }
}

/// The table, its free rows, and which rows are handed out.
#[derive(Debug)]
pub struct ReqToTokenPool {
    table: Vec<u32>,
    context_len: usize,
    free_rows: Vec<usize>,
    rows: usize,
    /// Per row: handed out and not yet freed (what makes a double free an O(1) check).
    held: Vec<bool>,
    /// Frees refused since start (each one a bookkeeping bug in a caller).
    refused_frees: u64,
}

impl ReqToTokenPool {
    pub fn new(max_running_requests: usize, pre_alloc: usize, context_len: usize) -> Self {
        let rows = max_running_requests + pre_alloc;
        ReqToTokenPool {
            table: vec![0; rows * context_len],
            context_len,
            free_rows: (0..rows).rev().collect(),
            rows,
            held: vec![false; rows],
            refused_frees: 0,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn available(&self) -> usize {
        self.free_rows.len()
    }

    pub fn alloc(&mut self) -> Option<usize> {
        let row = self.free_rows.pop()?;
        self.held[row] = true;
        Some(row)
    }

    /// Gives `row` back; a row that is not handed out is refused (and counted), so the free
    /// list never holds a row twice.
    pub fn free(&mut self, row: usize) -> Result<(), RowFreeError> {
        let refusal = match self.held.get_mut(row) {
            Some(held @ true) => {
                *held = false;
                self.free_rows.push(row);
                return Ok(());
            }
            Some(false) => RowFreeError::NotHeld { row },
            None => RowFreeError::OutOfRange {
                row,
                rows: self.rows,
            },
        };
        self.refused_frees += 1;
        Err(refusal)
    }

    /// Frees refused since start (0 unless a caller's bookkeeping is wrong).
    pub fn refused_frees(&self) -> u64 {
        self.refused_frees
    }

    /// Slots of row `row`, all `context_len` positions.
    pub fn row(&self, row: usize) -> &[u32] {
        &self.table[row * self.context_len..(row + 1) * self.context_len]
    }

    pub fn row_mut(&mut self, row: usize) -> &mut [u32] {
        &mut self.table[row * self.context_len..(row + 1) * self.context_len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn auto_prealloc_follows_the_decode_pool_rule() {
        let decode = DisaggMode::Decode;
        assert_eq!(DecodePrealloc::Auto.rows(decode, 8), 16);
        assert_eq!(DecodePrealloc::Auto.rows(decode, 32), 64);
        assert_eq!(DecodePrealloc::Auto.rows(decode, 33), 0);
        assert_eq!(DecodePrealloc::Rows(5).rows(decode, 100), 5);
        for other in [DisaggMode::Null, DisaggMode::Prefill] {
            assert_eq!(DecodePrealloc::Auto.rows(other, 8), 0);
            assert_eq!(DecodePrealloc::Rows(5).rows(other, 8), 0);
        }
        assert_eq!("auto".parse::<DecodePrealloc>(), Ok(DecodePrealloc::Auto));
        assert_eq!("3".parse::<DecodePrealloc>(), Ok(DecodePrealloc::Rows(3)));
        assert!("x".parse::<DecodePrealloc>().is_err());
    }

    #[test]
    fn rows_are_separate() {
        let mut pool = ReqToTokenPool::new(2, 1, 4);
        let a = pool.alloc().unwrap();
        let b = pool.alloc().unwrap();
        pool.row_mut(a).copy_from_slice(&[1, 2, 3, 4]);
        pool.row_mut(b).copy_from_slice(&[5, 6, 7, 8]);
        assert_eq!(pool.row(a), &[1, 2, 3, 4]);
        assert_eq!(pool.row(b), &[5, 6, 7, 8]);
        assert!(pool.alloc().is_some());
        assert!(pool.alloc().is_none(), "three rows in all");
    }

    #[test]
    fn a_double_free_is_refused_in_every_build_and_the_pool_stays_whole() {
        let mut pool = ReqToTokenPool::new(2, 0, 4);
        let a = pool.alloc().unwrap();
        assert!(pool.free(a).is_ok());
        // A second free of the same row, and a row the pool never had: each refused, not
        // pushed onto the free list (where the row would be handed to two requests).
        assert!(pool.free(a).is_err());
        assert!(pool.free(7).is_err());
        assert_eq!(pool.refused_frees(), 2);
        assert_eq!(pool.available(), 2);
        let (x, y) = (pool.alloc().unwrap(), pool.alloc().unwrap());
        assert_ne!(x, y);
        assert!(pool.alloc().is_none());
    }

    proptest! {
        #[test]
        fn rows_are_never_handed_out_twice(ops in prop::collection::vec(any::<bool>(), 1..200)) {
            let mut pool = ReqToTokenPool::new(4, 2, 3);
            let mut held = Vec::new();
            for alloc in ops {
                if alloc {
                    if let Some(r) = pool.alloc() {
                        prop_assert!(!held.contains(&r));
                        held.push(r);
                    } else {
                        prop_assert_eq!(held.len(), 6);
                    }
                } else if let Some(r) = held.pop() {
                    prop_assert!(pool.free(r).is_ok());
                }
                prop_assert_eq!(pool.available() + held.len(), pool.rows());
            }
        }
    }
}
