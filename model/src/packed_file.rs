//! One copy of a checkpoint's packed weights per host (`--weight-cache DIR`): the first rank to
//! load a checkpoint writes every weight matrix, packed for the GEMM kernels in the type it is
//! held in, into one file in DIR; every rank then maps that file read-only and its matrices view
//! the mapped pages ([`PackedMatrix::view`]), so N ranks on a host share one copy in the page
//! cache (clean, file-backed pages: counted once in the ranks' PSS, and reclaimable), and a
//! restart skips the packing. Norms and biases stay in each process (they are small).
//!
//! The checkpoint's own bytes cannot be mapped instead: the kernels read panels of 6 rows
//! interleaved in chunks of 16 and q/k/v and gate/up fused, not the `[out, in]` tensors as
//! stored.
//!
//! Which file: the name is a hash of a key naming everything the packed bytes depend on (the
//! file format, the dpserve version (how it converts may change with it), [`PackedMatrix::LAYOUT`], `--weight-dtype`, the model directory, config.json's
//! bytes, and each shard's name, size, modification time and safetensors header); the key is
//! also written into the file and compared in full when it is opened. A file is written beside
//! its final name and renamed into place once complete and synced, so a reader sees a whole
//! file or none; ranks take an exclusive lock on `NAME.lock` while they look, build and map, so
//! one builds and the others wait and map its file. A file that does not read back (another
//! version, truncated, another key, bytes that do not match the checksum written with it, or a
//! file another user could have written) is written again. Files of earlier checkpoints are not
//! removed: DIR is the operator's (its files can be deleted whenever no rank runs).
//!
//! Layout: `DPSWPK01`, the matrices (each at a 64-byte line), the table (JSON: key, layout,
//! each matrix's name, shape, type and offset), its length (u64, little-endian) and
//! `DPSWPK01` again.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kernels::{PackedMatrix, SharedBytes, WeightDtype};
use memmap2::Mmap;
use protocol::hash::fnv1a64;
use serde::{Deserialize, Serialize};

use super::elems::LoadDtype;
use super::error::{ModelError, Result};

/// The first and last 8 bytes of a packed weight file.
const MAGIC: &[u8; 8] = b"DPSWPK01";
/// Where the first matrix starts (one cache line: the magic, then zeros).
const DATA_START: u64 = 64;
/// The line every matrix starts on.
const LINE: u64 = 64;

/// What a packed weight file's bytes depend on, as text, and the file name it hashes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    text: String,
}

impl Key {
    /// The key of `dir`'s checkpoint (its config.json and `shards`, each file's path and its
    /// mapped bytes) held as `want` resolves.
    pub fn new(dir: &Path, shards: &[(PathBuf, Mmap)], want: LoadDtype) -> Result<Key> {
        let io = ModelError::io;
        let dir_abs = dir.canonicalize().map_err(|e| io(dir, e))?;
        let config = dir.join("config.json");
        let config_bytes = std::fs::read(&config).map_err(|e| io(&config, e))?;
        let mut text = format!(
            "dpserve packed weights 1, dpserve {}\nlayout: {}\nweight dtype: {}\ndir: {}\nconfig.json: {} bytes, fnv {:016x}\n",
            env!("CARGO_PKG_VERSION"),
            PackedMatrix::LAYOUT,
            want.name(),
            dir_abs.display(),
            config_bytes.len(),
            fnv1a64(&config_bytes),
        );
        for (path, bytes) in shards {
            let meta = std::fs::metadata(path).map_err(|e| io(path, e))?;
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            text.push_str(&format!(
                "shard {}: {} bytes, modified {mtime} ns, header fnv {:016x}\n",
                path.file_name().unwrap_or_default().to_string_lossy(),
                bytes.len(),
                fnv1a64(safetensors_header(bytes)),
            ));
        }
        Ok(Key { text })
    }

    /// The file's name in the cache directory.
    pub fn file_name(&self) -> String {
        format!("{:016x}.dpw", fnv1a64(self.text.as_bytes()))
    }
}

/// A safetensors file's length prefix and JSON header (tensor names, types, shapes, offsets),
/// as much of it as the file holds (a malformed file is refused by the loader anyway).
fn safetensors_header(file: &[u8]) -> &[u8] {
    let n = file.get(..8).map_or(0, |len| {
        u64::from_le_bytes(len.try_into().expect("8 bytes"))
    });
    &file[..(8u64.saturating_add(n)).min(file.len() as u64) as usize]
}

/// One matrix of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    name: String,
    rows: usize,
    cols: usize,
    dtype: String,
    offset: u64,
}

/// The table at a file's end.
#[derive(Debug, Serialize, Deserialize)]
struct Table {
    key: String,
    layout: String,
    matrices: Vec<Entry>,
    /// xxh3-64 of every byte before the table, as 16 hex digits: checked at each map, so a
    /// file changed in place (same size, other bytes) is written again, never served.
    #[serde(default)]
    checksum: String,
}

/// The exclusive lock on one key's file, held while a rank looks for it, builds it and maps it.
pub(crate) struct Lock {
    _file: File,
}

/// Waits for (and takes) the lock on `key`'s file in `dir`, creating `dir` if needed.
pub(crate) fn lock(dir: &Path, key: &Key) -> Result<Lock> {
    let io = ModelError::io;
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let path = dir.join(format!("{}.lock", key.file_name()));
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io(&path, e))?;
    file.lock().map_err(|e| io(&path, e))?;
    Ok(Lock { _file: file })
}

/// A mapped packed weight file.
pub(crate) struct PackedFile {
    path: PathBuf,
    bytes: SharedBytes,
    matrices: HashMap<String, Entry>,
}

/// Why a file in the cache cannot be used (it is then written again).
fn unusable(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::PackedFile {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl PackedFile {
    /// Maps `key`'s file in `dir`: `Ok(None)` when there is none; an error naming why when it
    /// is there but does not read back as that key's (see [`ModelError::is_packed_file`]).
    pub fn open(dir: &Path, key: &Key) -> Result<Option<PackedFile>> {
        let path = dir.join(key.file_name());
        let file = match File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unusable(&path, e.to_string())),
        };
        let meta = file
            .metadata()
            .map_err(|e| unusable(&path, e.to_string()))?;
        if let Some(why) = untrusted(&meta) {
            return Err(unusable(&path, why));
        }
        // SAFETY: the file is this user's, writable by no one else, written whole beside its
        // name and renamed into place, never modified afterwards (0444), and its bytes are
        // checked below; the map is read-only. Deleting the file keeps the mapped pages; only
        // this user (or root) truncating it under a running rank could still fault (SIGBUS).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| unusable(&path, e.to_string()))?;
        let (table, data) = read_table(&map).map_err(|why| unusable(&path, why))?;
        let sum = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&map[..data]));
        if table.checksum != sum {
            let why = if table.checksum.is_empty() {
                "it has no checksum (written by an earlier dpserve)".to_string()
            } else {
                format!(
                    "its bytes changed since it was written (checksum {sum}, written {})",
                    table.checksum
                )
            };
            return Err(unusable(&path, why));
        }
        if table.key != key.text {
            return Err(unusable(
                &path,
                "it was written for another checkpoint (key differs)",
            ));
        }
        if table.layout != PackedMatrix::LAYOUT {
            return Err(unusable(&path, "it holds another panel layout"));
        }
        let matrices = table
            .matrices
            .into_iter()
            .map(|e| (e.name.clone(), e))
            .collect();
        Ok(Some(PackedFile {
            path,
            bytes: Arc::new(map),
            matrices,
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of the file (what every rank that maps it shares).
    pub fn len(&self) -> usize {
        (*self.bytes).as_ref().len()
    }

    /// Whether the file holds a matrix `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.matrices.contains_key(name)
    }

    /// Matrix `name`, `[rows, cols]` of `dtype`, viewed in the mapped file.
    pub fn view(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        dtype: WeightDtype,
    ) -> Result<PackedMatrix> {
        let e = self
            .matrices
            .get(name)
            .ok_or_else(|| unusable(&self.path, format!("it has no matrix `{name}`")))?;
        if (e.rows, e.cols, e.dtype.as_str()) != (rows, cols, dtype.to_string().as_str()) {
            return Err(unusable(
                &self.path,
                format!(
                    "its `{name}` is [{}, {}] {}, the checkpoint's [{rows}, {cols}] {dtype}",
                    e.rows, e.cols, e.dtype
                ),
            ));
        }
        PackedMatrix::view(self.bytes.clone(), e.offset as usize, rows, cols, dtype)
            .map_err(|why| unusable(&self.path, format!("its `{name}`: {why}")))
    }
}

/// Why a file in the cache is not to be trusted: not a regular file, another user's, or
/// writable by group or others (this user's files there are 0444).
fn untrusted(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = protocol::current_uid()?;
    if !meta.is_file() {
        Some("it is not a regular file".into())
    } else if meta.uid() != me {
        Some(format!(
            "it belongs to uid {}, not to this user (uid {me})",
            meta.uid()
        ))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "others may write it (mode {:04o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    }
}

/// The table of a mapped file, checked against the file's length, and where it starts (the
/// end of the bytes its checksum covers).
fn read_table(map: &[u8]) -> std::result::Result<(Table, usize), String> {
    let n = map.len();
    if n < DATA_START as usize + 16 || &map[..8] != MAGIC || &map[n - 8..] != MAGIC {
        return Err("not a complete packed weight file of this version".into());
    }
    let len = u64::from_le_bytes(map[n - 16..n - 8].try_into().expect("8 bytes")) as usize;
    let start = (n - 16)
        .checked_sub(len)
        .filter(|&s| s >= DATA_START as usize)
        .ok_or("its table length runs past its start")?;
    let table: Table =
        serde_json::from_slice(&map[start..n - 16]).map_err(|e| format!("its table: {e}"))?;
    for e in &table.matrices {
        let dtype =
            parse_dtype(&e.dtype).ok_or_else(|| format!("its `{}`: type {}", e.name, e.dtype))?;
        // A shape with more elements than the file has bytes is damage (and would overflow).
        if e.rows.checked_mul(e.cols).is_none_or(|elems| elems > n) {
            return Err(format!("its `{}` is [{}, {}]", e.name, e.rows, e.cols));
        }
        let len = PackedMatrix::panel_len(e.rows, e.cols, dtype) as u64;
        if e.offset
            .checked_add(len)
            .is_none_or(|end| end > start as u64)
        {
            return Err(format!("its `{}` runs into its table", e.name));
        }
    }
    Ok((table, start))
}

fn parse_dtype(s: &str) -> Option<WeightDtype> {
    WeightDtype::ALL.into_iter().find(|d| d.to_string() == s)
}

/// A packed weight file being written (beside its final name until [`Self::finish`]).
pub(crate) struct PackedWriter {
    tmp: PathBuf,
    path: PathBuf,
    /// `None` once finished.
    out: Option<BufWriter<File>>,
    pos: u64,
    /// The checksum of everything written so far (boxed: its state is a few hundred bytes).
    sum: Box<xxhash_rust::xxh3::Xxh3>,
    key: Key,
    matrices: Vec<Entry>,
}

impl PackedWriter {
    /// Starts `key`'s file in `dir` (the caller holds its [`Lock`]).
    pub fn create(dir: &Path, key: &Key) -> Result<PackedWriter> {
        let path = dir.join(key.file_name());
        // Created new (O_EXCL: an existing name, a link included, is never followed or
        // reused) under a name no one can guess ahead, readable by this user only until done.
        let (tmp, file) = loop {
            let nonce: u64 = rand::random();
            let tmp = dir.join(format!(
                ".{}.{}.{nonce:016x}.tmp",
                key.file_name(),
                std::process::id()
            ));
            let made = File::options()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp);
            match made {
                Ok(file) => break (tmp, file),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(ModelError::io(&tmp, e)),
            }
        };
        let mut w = PackedWriter {
            tmp,
            path,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            pos: 0,
            sum: Box::default(),
            key: key.clone(),
            matrices: Vec::new(),
        };
        let mut head = [0u8; DATA_START as usize];
        head[..8].copy_from_slice(MAGIC);
        w.write(&head)?;
        Ok(w)
    }

    /// `bytes` appended to the file.
    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let out = self.out.as_mut().expect("a writer not yet finished");
        out.write_all(bytes)
            .map_err(|e| ModelError::io(&self.tmp, e))?;
        self.sum.update(bytes);
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Appends `m` as matrix `name`.
    pub fn append(&mut self, name: &str, m: &PackedMatrix) -> Result<()> {
        let pad = self.pos.next_multiple_of(LINE) - self.pos;
        self.write(&[0u8; LINE as usize][..pad as usize])?;
        self.matrices.push(Entry {
            name: name.to_string(),
            rows: m.rows(),
            cols: m.cols(),
            dtype: m.dtype().to_string(),
            offset: self.pos,
        });
        self.write(m.panel_bytes())
    }

    /// Writes the table, syncs the file and renames it into place, read-only.
    pub fn finish(mut self) -> Result<PathBuf> {
        let table = Table {
            key: self.key.text.clone(),
            layout: PackedMatrix::LAYOUT.to_string(),
            matrices: std::mem::take(&mut self.matrices),
            checksum: format!("{:016x}", self.sum.digest()),
        };
        let json = serde_json::to_vec(&table).expect("a table serialises");
        let tail = [&json[..], &(json.len() as u64).to_le_bytes(), MAGIC].concat();
        self.write(&tail)?;
        let file = self
            .out
            .take()
            .expect("a writer not yet finished")
            .into_inner()
            .map_err(|e| ModelError::io(&self.tmp, e.error()))?;
        let io = |e| ModelError::io(&self.tmp, e);
        file.sync_all().map_err(io)?;
        let mut perms = file.metadata().map_err(io)?.permissions();
        perms.set_readonly(true);
        file.set_permissions(perms).map_err(io)?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path).map_err(io)?;
        Ok(self.path.clone())
    }
}

impl Drop for PackedWriter {
    /// A writer dropped before [`Self::finish`] renamed its file (a load that failed, or a
    /// failed finish) leaves no temporary behind, also when an older file has the final name.
    /// After the rename there is no temporary, and removing it fails harmlessly.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> Key {
        Key { text: text.into() }
    }

    fn matrices() -> Vec<(String, PackedMatrix)> {
        let w: Vec<f32> = (0..7 * 33).map(|i| (i as f32 * 0.37).sin()).collect();
        let bits: Vec<u16> = w
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_bits())
            .collect();
        vec![
            ("a".into(), PackedMatrix::pack(&w, 7, 33)),
            (
                "b".into(),
                PackedMatrix::pack_16bit(&bits, 33, 7, WeightDtype::Bf16),
            ),
            ("empty".into(), PackedMatrix::pack(&[], 5, 0)),
        ]
    }

    #[test]
    fn a_written_file_maps_back_to_the_same_matrices() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("one checkpoint");
        assert!(PackedFile::open(dir.path(), &k).unwrap().is_none());
        let _lock = lock(dir.path(), &k).unwrap();
        let mut w = PackedWriter::create(dir.path(), &k).unwrap();
        for (name, m) in &matrices() {
            w.append(name, m).unwrap();
        }
        let path = w.finish().unwrap();
        assert!(std::fs::metadata(&path).unwrap().permissions().readonly());
        let file = PackedFile::open(dir.path(), &k).unwrap().unwrap();
        for (name, m) in &matrices() {
            let v = file.view(name, m.rows(), m.cols(), m.dtype()).unwrap();
            assert!(v.is_shared());
            assert_eq!(v.unpack(), m.unpack(), "{name}");
        }
        assert!(file.contains("a") && !file.contains("c"));
        // Asked for another shape or type, or for a matrix it lacks: refused, naming it.
        for err in [
            file.view("a", 7, 32, WeightDtype::F32).err().unwrap(),
            file.view("b", 33, 7, WeightDtype::F16).err().unwrap(),
            file.view("c", 1, 1, WeightDtype::F32).err().unwrap(),
        ] {
            assert!(err.is_packed_file(), "{err}");
        }
        // Only the file and its lock are left: no temporary beside them.
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [k.file_name(), format!("{}.lock", k.file_name())]);
    }

    #[test]
    fn a_file_of_another_key_or_cut_short_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("first");
        let mut w = PackedWriter::create(dir.path(), &k).unwrap();
        w.append("a", &matrices()[0].1).unwrap();
        let path = w.finish().unwrap();
        // The same name with another key inside (a hash collision, or a file copied over).
        let other = key("second");
        std::fs::rename(&path, dir.path().join(other.file_name())).unwrap();
        let err = PackedFile::open(dir.path(), &other).err().unwrap();
        assert!(err.to_string().contains("another checkpoint"), "{err}");
        // Cut short: the trailing magic is gone.
        let p = dir.path().join(other.file_name());
        let bytes = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        let err = PackedFile::open(dir.path(), &other).err().unwrap();
        assert!(
            err.is_packed_file() && err.to_string().contains("complete"),
            "{err}"
        );
    }

    fn chmod(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_file_changed_in_place_writable_by_others_or_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("k");
        let mut w = PackedWriter::create(dir.path(), &k).unwrap();
        w.append("a", &matrices()[0].1).unwrap();
        let path = w.finish().unwrap();
        let refused = |want: &str| {
            let err = PackedFile::open(dir.path(), &k).err().expect("refused");
            assert!(
                err.is_packed_file() && err.to_string().contains(want),
                "{err}"
            );
        };
        // One matrix byte overwritten, same size (what a bad disk or a careless copy does).
        let good = std::fs::read(&path).unwrap();
        let mut bad = good.clone();
        bad[DATA_START as usize + 5] ^= 0x40;
        chmod(&path, 0o644);
        std::fs::write(&path, &bad).unwrap();
        chmod(&path, 0o444);
        refused("its bytes changed since it was written");
        // Writable by others.
        std::fs::write(&path, &good).unwrap_or_else(|_| {
            chmod(&path, 0o644);
            std::fs::write(&path, &good).unwrap();
        });
        chmod(&path, 0o666);
        refused("others may write it (mode 0666)");
        chmod(&path, 0o444);
        assert!(PackedFile::open(dir.path(), &k).unwrap().is_some());
        // A link at the file's name (to a file that would pass) is not followed.
        let real = dir.path().join("elsewhere");
        std::fs::rename(&path, &real).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        let err = PackedFile::open(dir.path(), &k).err().expect("refused");
        assert!(err.is_packed_file(), "{err}");
    }

    #[test]
    fn a_temporary_is_made_new_under_a_name_no_one_can_guess() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("k");
        let (a, b) = (
            PackedWriter::create(dir.path(), &k).unwrap(),
            PackedWriter::create(dir.path(), &k).unwrap(),
        );
        assert_ne!(a.tmp, b.tmp);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&a.tmp).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_table_naming_more_than_the_file_holds_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("k");
        let mut w = PackedWriter::create(dir.path(), &k).unwrap();
        w.append("a", &matrices()[0].1).unwrap();
        let path = w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        let len = u64::from_le_bytes(bytes[n - 16..n - 8].try_into().unwrap()) as usize;
        let start = n - 16 - len;
        let table = String::from_utf8(bytes[start..n - 16].to_vec()).unwrap();
        for (from, to) in [
            ("\"rows\":7", format!("\"rows\":{}", u64::MAX)),
            ("\"offset\":64", format!("\"offset\":{}", u64::MAX - 8)),
            ("\"offset\":64", format!("\"offset\":{}", n)),
        ] {
            assert!(table.contains(from), "{table}");
            let bad = table.replace(from, &to);
            let mut file = bytes[..start].to_vec();
            file.extend(bad.as_bytes());
            file.extend((bad.len() as u64).to_le_bytes());
            file.extend(MAGIC);
            std::fs::remove_file(&path).unwrap();
            std::fs::write(&path, &file).unwrap();
            let err = PackedFile::open(dir.path(), &k).err().unwrap();
            assert!(err.is_packed_file(), "{to}: {err}");
        }
    }

    #[test]
    fn a_writer_dropped_unfinished_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("k");
        let mut w = PackedWriter::create(dir.path(), &k).unwrap();
        w.append("a", &matrices()[0].1).unwrap();
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // Nor when an older file has the final name (one being written again).
        let mut w = PackedWriter::create(dir.path(), &k).unwrap();
        w.append("a", &matrices()[0].1).unwrap();
        let old = w.finish().unwrap();
        let mut w = PackedWriter::create(dir.path(), &k).unwrap();
        w.append("a", &matrices()[0].1).unwrap();
        drop(w);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(left, [old]);
    }

    #[test]
    fn a_safetensors_header_is_its_length_prefix_and_json_however_the_file_ends() {
        let mut file = 5u64.to_le_bytes().to_vec();
        file.extend(b"{\"a\"}tensor bytes");
        assert_eq!(safetensors_header(&file), &file[..13]);
        assert_eq!(safetensors_header(&file[..10]), &file[..10]);
        assert_eq!(safetensors_header(&file[..3]), &file[..3]);
        let huge = u64::MAX.to_le_bytes();
        assert_eq!(safetensors_header(&huge), &huge[..]);
    }
}
