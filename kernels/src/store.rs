//! Where a packed matrix's elements live: in a buffer of its own ([`Store::Owned`]), or in
//! read-only bytes that many matrices, and many processes, view at once ([`SharedBytes`]: a
//! memory map of a packed weight file, whose pages the kernel keeps once per host however many
//! ranks map it). The kernels read either as a `&[T]`; nothing else differs.

use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

use crate::linevec::LineBuf;
use crate::wdtype::Plain;

/// Read-only bytes shared by the matrices that view them (they live as long as any of them
/// does). The slice must not change while they do: a memory map of a file nobody writes.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Bytes in one cache line: where a view must start (as [`LineBuf`] starts).
const LINE_BYTES: usize = 64;

/// Why a view of shared bytes could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("{len} bytes at offset {offset} run past the end of {total}")]
    OutOfBounds {
        offset: usize,
        len: usize,
        total: usize,
    },
    #[error("offset {offset} does not start a 64-byte cache line")]
    Misaligned { offset: usize },
}

/// A matrix's elements, owned or viewed.
#[derive(Clone)]
pub(crate) enum Store<T> {
    Owned(LineBuf<T>),
    Shared {
        bytes: SharedBytes,
        /// Byte offset of the first element.
        offset: usize,
        /// Elements.
        len: usize,
        elem: PhantomData<T>,
    },
}

impl<T: Plain> Store<T> {
    /// `len` elements of `bytes` from byte `offset`, which must start a cache line.
    pub(crate) fn view(bytes: SharedBytes, offset: usize, len: usize) -> Result<Self, ViewError> {
        let all = (*bytes).as_ref();
        let size = len * std::mem::size_of::<T>();
        if offset.checked_add(size).is_none_or(|end| end > all.len()) {
            return Err(ViewError::OutOfBounds {
                offset,
                len: size,
                total: all.len(),
            });
        }
        if !(all.as_ptr() as usize + offset).is_multiple_of(LINE_BYTES) {
            return Err(ViewError::Misaligned { offset });
        }
        Ok(Store::Shared {
            bytes,
            offset,
            len,
            elem: PhantomData,
        })
    }

    /// Whether the elements are viewed in shared bytes.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, Store::Shared { .. })
    }

    /// The elements as bytes (little-endian on every target the kernels build for).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        let elems: &[T] = self;
        // SAFETY: `T` is f32, Bf16, F16 or u8 (sealed), plain data without padding, so its elements
        // are `size_of_val` initialised bytes; u8 has no alignment.
        unsafe { std::slice::from_raw_parts(elems.as_ptr().cast::<u8>(), size_of_val(elems)) }
    }
}

impl<T: Plain> Deref for Store<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Store::Owned(b) => b,
            Store::Shared {
                bytes, offset, len, ..
            } => {
                // Checked again on every use (once per GEMM call, not per element), so no
                // `AsRef` implementation can make this read outside its bytes or misaligned.
                let b = &(**bytes).as_ref()[*offset..*offset + *len * std::mem::size_of::<T>()];
                assert!(
                    (b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()),
                    "misaligned view"
                );
                // SAFETY: `b` holds exactly `len` elements' bytes, aligned for `T` (checked just
                // above); every bit pattern is a valid f32, Bf16, F16 or u8; the bytes are read-only
                // for as long as `bytes` lives (the contract of `SharedBytes`).
                unsafe { std::slice::from_raw_parts(b.as_ptr().cast::<T>(), *len) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shared bytes that start a line: a line-aligned buffer of bytes.
    struct Aligned(LineBuf<u8>);

    impl AsRef<[u8]> for Aligned {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    fn shared(bytes: &[u8]) -> SharedBytes {
        let mut b = LineBuf::zeroed(bytes.len());
        b.copy_from_slice(bytes);
        Arc::new(Aligned(b))
    }

    #[test]
    fn a_view_reads_the_elements_at_its_offset() {
        let mut raw = vec![0u8; 64];
        for v in [1.5f32, -2.0, 3.25] {
            raw.extend(v.to_le_bytes());
        }
        let s = Store::<f32>::view(shared(&raw), 64, 3).unwrap();
        assert_eq!(&s[..], &[1.5, -2.0, 3.25]);
        assert!(s.is_shared());
        assert_eq!(s.as_bytes(), &raw[64..]);
    }

    #[test]
    fn a_view_past_the_end_or_off_a_line_is_refused() {
        let b = shared(&[0u8; 128]);
        assert_eq!(
            Store::<f32>::view(b.clone(), 64, 17).err(),
            Some(ViewError::OutOfBounds {
                offset: 64,
                len: 68,
                total: 128
            })
        );
        assert_eq!(
            Store::<f32>::view(b.clone(), 4, 1).err(),
            Some(ViewError::Misaligned { offset: 4 })
        );
        assert!(Store::<f32>::view(b.clone(), usize::MAX - 2, 1).is_err());
        assert!(Store::<f32>::view(b, 64, 16).is_ok());
    }
}
