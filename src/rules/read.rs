//! Reading a rules file that may be hostile: only a regular file (links followed), opened
//! without blocking (a FIFO with no writer would block `open` until one comes), at most a
//! cap of bytes (a file that never ends, or a huge one, stops there), and on a thread of
//! its own that the caller stops waiting for after a timeout (a read hung on a network
//! filesystem).

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use crate::base::error::ConfigError;

/// The largest rules file read by default: 16 MiB.
pub(crate) const DEFAULT_MAX_FILE_SIZE: u64 = 16 * 1024 * 1024;

/// How long a load waits for the file's bytes by default.
pub(crate) const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads a rules file: at most `max_size` bytes of UTF-8, from a regular file.
#[derive(Debug, Clone)]
pub(crate) struct FileReader {
    pub(crate) max_size: u64,
    pub(crate) timeout: Duration,
    /// The reading threads still running: one that outlived its caller's wait
    /// (abandoned) until it returns.
    readers: Arc<AtomicUsize>,
}

impl FileReader {
    pub(crate) fn new(max_size: u64, timeout: Duration) -> Self {
        Self {
            max_size,
            timeout,
            readers: Arc::default(),
        }
    }

    /// Reads `path` on a thread of its own, waiting at most the timeout for it. A read
    /// that takes longer is abandoned with an error (its thread may stay blocked, its
    /// text is dropped); until it returns, no other read starts: there is never more than
    /// one blocked thread. One caller at a time.
    pub(crate) fn read(&self, path: &Path) -> Result<String, ConfigError> {
        let owned: PathBuf = path.to_owned();
        let max_size = self.max_size;
        self.within(path, move || read(&owned, max_size))
    }

    fn within<F>(&self, path: &Path, read: F) -> Result<String, ConfigError>
    where
        F: FnOnce() -> Result<String, ConfigError> + Send + 'static,
    {
        if self.readers.load(Ordering::Acquire) > 0 {
            return Err(cannot(
                path,
                format!(
                    "an earlier read has not returned (it was abandoned after {:?}); \
                     none starts until it does",
                    self.timeout
                ),
            ));
        }
        /// Counts a reading thread until it has read (or failed).
        struct Reading(Arc<AtomicUsize>);
        impl Drop for Reading {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.readers.fetch_add(1, Ordering::AcqRel);
        let reading = Reading(self.readers.clone());
        let (tx, rx) = mpsc::sync_channel(1);
        // Not `spawn_blocking`: a runtime waits for its blocking tasks when it shuts down,
        // and this one may never return.
        std::thread::Builder::new()
            .name("tollgate-rules-read".into())
            .spawn(move || {
                let text = read();
                drop(reading);
                let _ = tx.send(text);
            })
            .map_err(|e| cannot(path, format!("no thread to read it: {e}")))?;
        match rx.recv_timeout(self.timeout) {
            Ok(text) => text,
            Err(RecvTimeoutError::Timeout) => Err(cannot(
                path,
                format!(
                    "no answer within {:?} (`read_timeout`); the read is abandoned",
                    self.timeout
                ),
            )),
            Err(RecvTimeoutError::Disconnected) => Err(cannot(path, "the reading thread failed")),
        }
    }
}

/// Reads `path` in the calling thread: at most `max_size` bytes of UTF-8, from a regular
/// file (after links). Nothing else is read: a FIFO, a device (`/dev/zero`), a directory
/// or a socket is refused without blocking.
pub(crate) fn read(path: &Path, max_size: u64) -> Result<String, ConfigError> {
    let file = open(path).map_err(|e| cannot(path, e))?;
    // The type of what was opened, not of what the path named a moment before.
    let meta = file.metadata().map_err(|e| cannot(path, e))?;
    if !meta.is_file() {
        return Err(cannot(
            path,
            format!("it is {}, not a regular file", kind(&meta.file_type())),
        ));
    }
    let hint = meta.len().min(max_size);
    let mut bytes = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
    // One byte more than the cap tells a file at the cap from a larger one.
    file.take(max_size.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| cannot(path, e))?;
    if bytes.len() as u64 > max_size {
        return Err(cannot(
            path,
            format!("larger than {max_size} bytes (`max_file_size`)"),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        cannot(
            path,
            format!("not UTF-8 (at byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// Opens for reading without waiting for a FIFO's writer (nor making a terminal the
/// process's own).
#[cfg(unix)]
fn open(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

#[cfg(not(unix))]
fn open(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

/// What a file that is not a regular one is, in words.
fn kind(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return "a device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

fn cannot(path: &Path, reason: impl fmt::Display) -> ConfigError {
    ConfigError::new("", format!("cannot read the rules: {reason}"))
        .located(Some(&path.display().to_string()), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_does_not_answer_is_abandoned_and_no_other_starts_until_it_returns() {
        let reader = FileReader::new(DEFAULT_MAX_FILE_SIZE, Duration::from_millis(50));
        let path = Path::new("rules.toml");
        let (release, blocked) = mpsc::channel::<()>();
        // A read blocked until released, as one on a hung filesystem.
        let err = reader
            .within(path, move || {
                let _ = blocked.recv();
                Ok("late".into())
            })
            .unwrap_err();
        assert!(err.reason().contains("no answer within 50ms"), "{err}");
        assert_eq!(err.file(), Some("rules.toml"));
        // Still blocked: the next read is refused at once, without a thread.
        let err = reader.within(path, || Ok("next".into())).unwrap_err();
        assert!(
            err.reason().contains("an earlier read has not returned"),
            "{err}"
        );
        assert_eq!(reader.readers.load(Ordering::Acquire), 1);
        // Once it returns (its text dropped), reads start again.
        release.send(()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while reader.readers.load(Ordering::Acquire) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the read never returned"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let reader = FileReader {
            timeout: Duration::from_secs(10),
            ..reader
        };
        assert_eq!(reader.within(path, || Ok("next".into())).unwrap(), "next");
    }
}
