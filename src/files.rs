//! The one way this crate reads inputs and writes outputs, so that no command
//! can clobber a device node, follow a symlink by accident, leave a half
//! written file, or read `/dev/zero` into memory.
//!
//! Outputs: a path that does not exist is created; a regular file is
//! replaced; a symlink whose chain ends at a regular file is written THROUGH
//! (the target is replaced, the link kept); anything else that exists (a
//! folder, a device, a FIFO, a socket) is refused. A dangling symlink is
//! refused too: creating its target would write to a place the user never
//! named, and replacing the link would silently drop it.
//!
//! Every write goes to a private temporary file beside the target, is
//! fsynced and renamed into place; the temporary file is removed on every
//! error path and, through [`interrupt`], on SIGINT/SIGTERM.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a file could not be read or written: one line naming the path.
#[derive(Debug)]
pub struct FileError {
    path: PathBuf,
    action: Action,
    reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Read,
    Write,
}

impl FileError {
    fn new(action: Action, path: &Path, reason: impl Into<String>) -> Self {
        FileError {
            path: path.to_path_buf(),
            action,
            reason: reason.into(),
        }
    }

    fn read(path: &Path, reason: impl Into<String>) -> Self {
        FileError::new(Action::Read, path, reason)
    }

    fn write(path: &Path, reason: impl Into<String>) -> Self {
        FileError::new(Action::Write, path, reason)
    }

    /// The path the user named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why it failed, without the path.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.action {
            Action::Read => "read",
            Action::Write => "write",
        };
        write!(
            f,
            "cannot {verb} `{}`: {}",
            self.path.display(),
            self.reason
        )
    }
}

impl std::error::Error for FileError {}

impl From<FileError> for mxswitch_runtime::Error {
    fn from(e: FileError) -> Self {
        mxswitch_runtime::Error::Io(e.to_string())
    }
}

/// An I/O error in words, without the temporary names some callers add.
fn io_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "it does not exist".into(),
        io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => match e.raw_os_error() {
            // The bare OS message: the library's own text may name a temp file.
            Some(code) => io::Error::from_raw_os_error(code).to_string(),
            None => e.to_string(),
        },
    }
}

/// "a folder", "a character device", ...: what a non-regular file is.
fn kind_of(meta: &fs::Metadata) -> &'static str {
    let ft = meta.file_type();
    if ft.is_dir() {
        return "a folder";
    }
    if ft.is_symlink() {
        return "a symbolic link";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
        if ft.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}

/// Where a write to `path` must land: `path` itself if it does not exist or
/// is a regular file; the final target of a symlink chain that ends at a
/// regular file (written through the link, the link kept); an error for
/// anything else that exists, and for a dangling or looping symlink.
pub fn output_target(path: &Path) -> Result<PathBuf, FileError> {
    let refuse = |what: &str| {
        FileError::write(
            path,
            format!("it exists and is {what}, not a regular file; choose another path"),
        )
    };
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(path.to_path_buf()),
        Err(e) => return Err(FileError::write(path, io_reason(&e))),
    };
    if meta.is_file() {
        return Ok(path.to_path_buf());
    }
    if !meta.file_type().is_symlink() {
        return Err(refuse(kind_of(&meta)));
    }
    match fs::metadata(path) {
        Ok(m) if m.is_file() => fs::canonicalize(path).map_err(|e| {
            FileError::write(
                path,
                format!("cannot resolve the symbolic link: {}", io_reason(&e)),
            )
        }),
        Ok(m) => Err(FileError::write(
            path,
            format!(
                "it is a symbolic link to {}, not to a regular file; choose another path",
                kind_of(&m)
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let to = fs::read_link(path).unwrap_or_default();
            Err(FileError::write(
                path,
                format!(
                    "it is a symbolic link to `{}`, which does not exist; \
                     remove the link or choose another path",
                    to.display()
                ),
            ))
        }
        Err(e) => Err(FileError::write(
            path,
            format!(
                "it is a symbolic link that cannot be followed: {}",
                io_reason(&e)
            ),
        )),
    }
}

/// True when `a` and `b` are the same file by identity (device and inode on
/// Unix, after following symlinks), not by name. False if either is missing.
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (fs::metadata(a), fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        match (fs::canonicalize(a), fs::canonicalize(b)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
    }
}

/// The name of a temporary file being written: removed (and unregistered)
/// on drop unless it was renamed into place.
struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// Create a new private temporary file in `dir` for `target_name`,
    /// registered for removal on a signal before anyone can see it.
    fn create(dir: &Path, target_name: &str) -> io::Result<(TempFile, File)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        // Part of the target's name tells whose temporary this is; all of
        // it could push a long name past the file system's limit.
        let short: String = target_name.chars().take(48).collect();
        for _ in 0..64 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!(".mxswitch-{short}-{pid}-{n}-{nanos:08x}.tmp");
            let path = dir.join(name);
            // Create and register under the registry lock, so a signal
            // handler sees either no file or a registered one.
            let mut registry = interrupt::registry();
            // `create_new` uses mode 0666: the umask gives the permissions
            // of any new file, never someone else's existing file.
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    registry.push(path.clone());
                    return Ok((TempFile { path }, file));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free temporary file name in the output's folder",
        ))
    }

    /// Rename over `target`; the temporary is unregistered in the same step.
    fn persist(mut self, target: &Path) -> io::Result<()> {
        let mut registry = interrupt::registry();
        fs::rename(&self.path, target)?;
        registry.retain(|p| p != &self.path);
        self.path = PathBuf::new();
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        let mut registry = interrupt::registry();
        let _ = fs::remove_file(&self.path);
        registry.retain(|p| p != &self.path);
    }
}

/// Write a file atomically: `write` fills a private temporary file in the
/// target's folder (see [`output_target`]), which is then fsynced and
/// renamed over the target. On any error the temporary file is removed and
/// an existing target is untouched; a SIGINT/SIGTERM removes it too.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), FileError> {
    interrupt::install();
    let target = output_target(path)?;
    let Some(name) = target.file_name().and_then(|n| n.to_str()) else {
        let reason = if target.file_name().is_none() {
            "it names no file; give a file path"
        } else {
            "its file name is not UTF-8; choose another name"
        };
        return Err(FileError::write(path, reason));
    };
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(FileError::write(
            path,
            format!("folder `{}` does not exist", dir.display()),
        ));
    }
    let fail = |e: io::Error| FileError::write(path, io_reason(&e));
    // On an early return `file` is closed first, then `tmp` removes the file.
    let (tmp, mut file) = TempFile::create(dir, name).map_err(fail)?;
    write(&mut file).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    drop(file);
    tmp.persist(&target).map_err(fail)?;
    // Make the rename itself durable. Some file systems cannot sync a
    // folder; the file is in place either way, so that is no failure.
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Read a whole file that must be a regular file (symlinks followed), refusing
/// anything larger than `limit` bytes and never reading past the size it had
/// when opened, so a device, a FIFO or a growing file cannot fill memory.
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    let fail = |e: io::Error| FileError::read(path, io_reason(&e));
    let not_regular = |m: &fs::Metadata| {
        FileError::read(path, format!("it is {}, not a regular file", kind_of(m)))
    };
    // Check before opening: opening a FIFO would block until a writer comes.
    let meta = fs::metadata(path).map_err(fail)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let file = File::open(path).map_err(fail)?;
    // The file opened may not be the one checked (a rename in between).
    let meta = file.metadata().map_err(fail)?;
    if !meta.is_file() {
        return Err(not_regular(&meta));
    }
    let size = meta.len();
    if size > limit {
        return Err(FileError::read(
            path,
            format!("it is {size} bytes, more than the limit of {limit} bytes"),
        ));
    }
    let capacity = usize::try_from(size).map_err(|_| {
        FileError::read(
            path,
            format!("it is {size} bytes, too large for this machine"),
        )
    })?;
    let mut bytes = Vec::new();
    // A file larger than free memory is an error, not an abort.
    bytes.try_reserve_exact(capacity).map_err(|_| {
        FileError::read(
            path,
            format!("it is {size} bytes, more than fits in memory"),
        )
    })?;
    file.take(size).read_to_end(&mut bytes).map_err(fail)?;
    Ok(bytes)
}

/// SIGINT/SIGTERM handling: remove every temporary file [`write_atomically`]
/// has open, then exit with status 130; or, in graceful mode, let the first
/// signal only ask the caller to stop.
pub mod interrupt {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, MutexGuard, Once};

    /// Exit status after a signal (128 + SIGINT, the shell's convention).
    pub const EXIT_STATUS: i32 = 130;

    static TEMP_FILES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    static INSTALL: Once = Once::new();
    static GRACEFUL: AtomicBool = AtomicBool::new(false);
    static REQUESTED: AtomicBool = AtomicBool::new(false);

    /// The registered temporary files. A panic elsewhere must not stop the
    /// cleanup, so a poisoned lock is used as is.
    pub(super) fn registry() -> MutexGuard<'static, Vec<PathBuf>> {
        TEMP_FILES.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Install the SIGINT/SIGTERM handler; later calls do nothing. If the
    /// process already has a handler (another library's), that one stays
    /// and temporary files are then only removed on error paths.
    pub fn install() {
        INSTALL.call_once(|| {
            let _ = ctrlc::set_handler(on_signal);
        });
    }

    /// Graceful mode (for `train`): the first signal only sets the flag that
    /// [`requested`] returns, so the caller can stop after the current step;
    /// a second signal cleans up and exits as usual.
    pub fn set_graceful(on: bool) {
        GRACEFUL.store(on, Ordering::SeqCst);
    }

    /// True once a signal arrived in graceful mode.
    pub fn requested() -> bool {
        REQUESTED.load(Ordering::SeqCst)
    }

    /// Runs on ctrlc's own thread, not in signal context, so it may lock
    /// and touch the file system.
    fn on_signal() {
        if GRACEFUL.load(Ordering::SeqCst) && !REQUESTED.swap(true, Ordering::SeqCst) {
            return;
        }
        // Holding the lock until exit keeps a rename from racing the removal.
        let files = registry();
        for p in files.iter() {
            let _ = std::fs::remove_file(p);
        }
        std::process::exit(EXIT_STATUS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("a temporary folder")
    }

    /// Names in `d` that look like our temporary files.
    fn temp_files(d: &Path) -> Vec<String> {
        fs::read_dir(d)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(".mxswitch-"))
            .collect()
    }

    fn write_str(path: &Path, s: &str) -> Result<(), FileError> {
        write_atomically(path, |f| f.write_all(s.as_bytes()))
    }

    #[cfg(unix)]
    fn mkfifo(path: &Path) -> bool {
        let ok = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: `mkfifo` is not available here");
        }
        ok
    }

    #[test]
    fn new_and_regular_files_are_written_in_place() {
        let d = dir();
        let p = d.path().join("out.bin");
        assert_eq!(output_target(&p).unwrap(), p);
        write_str(&p, "one").unwrap();
        assert_eq!(output_target(&p).unwrap(), p);
        write_str(&p, "two").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two");
        assert!(temp_files(d.path()).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn new_file_gets_umask_permissions_not_private_ones() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir();
        let made = d.path().join("made");
        File::create(&made).unwrap();
        let p = d.path().join("out");
        write_str(&p, "x").unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&p), mode(&made));
    }

    #[cfg(unix)]
    #[test]
    fn symlink_chain_is_written_through_and_kept() {
        let d = dir();
        let real = d.path().join("real");
        fs::write(&real, "old").unwrap();
        let l1 = d.path().join("l1");
        let l2 = d.path().join("l2");
        std::os::unix::fs::symlink(&real, &l1).unwrap();
        std::os::unix::fs::symlink(&l1, &l2).unwrap();
        assert_eq!(
            output_target(&l2).unwrap(),
            fs::canonicalize(&real).unwrap()
        );
        write_str(&l2, "new").unwrap();
        assert!(fs::symlink_metadata(&l2).unwrap().file_type().is_symlink());
        assert!(fs::symlink_metadata(&l1).unwrap().file_type().is_symlink());
        assert_eq!(fs::read_to_string(&real).unwrap(), "new");
        assert!(temp_files(d.path()).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn dangling_symlink_is_refused_and_nothing_created() {
        let d = dir();
        let missing = d.path().join("missing");
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&missing, &link).unwrap();
        let err = write_str(&link, "x").unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
        assert!(err.contains("link"), "{err}");
        assert!(!missing.exists());
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[cfg(unix)]
    #[test]
    fn symlink_to_a_folder_is_refused() {
        let d = dir();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(d.path(), &link).unwrap();
        let err = output_target(&link).unwrap_err().to_string();
        assert!(err.contains("symbolic link to a folder"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn fifo_is_refused_and_left_alone() {
        let d = dir();
        let p = d.path().join("fifo");
        if !mkfifo(&p) {
            return;
        }
        let err = write_str(&p, "x").unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "cannot write `{}`: it exists and is a FIFO (named pipe), \
                 not a regular file; choose another path",
                p.display()
            )
        );
        use std::os::unix::fs::FileTypeExt;
        assert!(fs::symlink_metadata(&p).unwrap().file_type().is_fifo());
        assert!(temp_files(d.path()).is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn character_device_is_refused() {
        let err = output_target(Path::new("/dev/null"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is a character device, not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn folder_is_refused() {
        let d = dir();
        let err = write_str(d.path(), "x").unwrap_err().to_string();
        assert!(err.contains("it exists and is a folder"), "{err}");
        assert!(err.starts_with("cannot write `"), "{err}");
    }

    #[test]
    fn a_name_at_the_length_limit_still_gets_a_temporary_file() {
        let d = dir();
        let p = d.path().join("n".repeat(255));
        write_str(&p, "x").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "x");
    }

    #[test]
    fn missing_folder_is_one_clear_line() {
        let d = dir();
        let p = d.path().join("no/such/out");
        let err = write_str(&p, "x").unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn error_in_write_leaves_no_temp_and_old_file_untouched() {
        let d = dir();
        let p = d.path().join("out");
        fs::write(&p, "old").unwrap();
        let err = write_atomically(&p, |f| {
            f.write_all(b"partial")?;
            Err(io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("cannot write `{}`: disk on fire", p.display())
        );
        assert_eq!(fs::read_to_string(&p).unwrap(), "old");
        assert!(temp_files(d.path()).is_empty());
        assert!(interrupt::registry()
            .iter()
            .all(|t| !t.starts_with(d.path())));
    }

    #[test]
    fn panic_in_write_leaves_no_temp() {
        let d = dir();
        let p = d.path().join("out");
        let r = std::panic::catch_unwind(|| {
            let _ = write_atomically(&p, |_| panic!("writer bug"));
        });
        assert!(r.is_err());
        assert!(temp_files(d.path()).is_empty());
        assert!(!p.exists());
    }

    #[test]
    fn temp_file_is_registered_while_written() {
        let d = dir();
        let p = d.path().join("out");
        let mut seen = Vec::new();
        write_atomically(&p, |_| {
            seen = interrupt::registry()
                .iter()
                .filter(|t| t.starts_with(d.path()))
                .cloned()
                .collect();
            Ok(())
        })
        .unwrap();
        assert_eq!(seen.len(), 1);
        assert!(!seen[0].exists());
        assert!(interrupt::registry().iter().all(|t| t != &seen[0]));
    }

    #[test]
    fn identity_via_hard_link_and_symlink() {
        let d = dir();
        let a = d.path().join("a");
        let b = d.path().join("b");
        fs::write(&a, "x").unwrap();
        fs::write(&b, "x").unwrap();
        assert!(same_file(&a, &a));
        assert!(!same_file(&a, &b));
        assert!(!same_file(&a, &d.path().join("missing")));
        let hard = d.path().join("hard");
        fs::hard_link(&a, &hard).unwrap();
        assert!(same_file(&a, &hard));
        #[cfg(unix)]
        {
            let soft = d.path().join("soft");
            std::os::unix::fs::symlink(&a, &soft).unwrap();
            assert!(same_file(&soft, &a));
            assert!(!same_file(&soft, &b));
        }
        // A different spelling of the same name.
        assert!(same_file(&a, &d.path().join(".").join("a")));
    }

    #[test]
    fn read_regular_reads_and_bounds() {
        let d = dir();
        let p = d.path().join("f");
        fs::write(&p, b"hello").unwrap();
        assert_eq!(read_regular(&p, 5).unwrap(), b"hello");
        let err = read_regular(&p, 4).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "cannot read `{}`: it is 5 bytes, more than the limit of 4 bytes",
                p.display()
            )
        );
        let err = read_regular(&d.path().join("none"), 10)
            .unwrap_err()
            .to_string();
        assert!(err.ends_with(": it does not exist"), "{err}");
        let err = read_regular(d.path(), 10).unwrap_err().to_string();
        assert!(err.ends_with("it is a folder, not a regular file"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn read_regular_refuses_dev_zero() {
        let err = read_regular(Path::new("/dev/zero"), u64::MAX)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "cannot read `/dev/zero`: it is a character device, not a regular file"
        );
    }

    #[cfg(unix)]
    #[test]
    fn read_regular_refuses_fifo_without_blocking() {
        let d = dir();
        let p = d.path().join("fifo");
        if !mkfifo(&p) {
            return;
        }
        let err = read_regular(&p, u64::MAX).unwrap_err().to_string();
        assert!(
            err.ends_with("it is a FIFO (named pipe), not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn file_error_becomes_runtime_io_error() {
        let e: mxswitch_runtime::Error = FileError::write(Path::new("x"), "why").into();
        assert!(matches!(&e, mxswitch_runtime::Error::Io(_)));
        assert_eq!(e.to_string(), "cannot write `x`: why");
    }
}
