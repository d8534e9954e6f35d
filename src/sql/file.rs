//! [`DbFile`]: the file a SQLite pool of the rules opened, checked at each poll. A pooled
//! connection keeps reading the file it opened, even once it is deleted or replaced at its
//! path; this notices, so that the poller reports it or opens the new file.

use std::fs::Metadata;
use std::path::PathBuf;
use std::time::Duration;

use super::SqlPool;

/// Which file a path named (device and inode on Unix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    #[cfg(unix)]
    fn of(meta: &Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }

    /// Without inodes, a file is known by its path only: a replaced file is not noticed.
    #[cfg(not(unix))]
    fn of(_meta: &Metadata) -> Self {
        Self { dev: 0, ino: 0 }
    }
}

/// The database file of a SQLite pool opened on a path, and which file it was.
#[derive(Debug)]
pub(crate) struct DbFile {
    path: PathBuf,
    id: FileId,
}

impl DbFile {
    /// The file `pool` reads: `None` unless it is a SQLite pool opened on a path where a
    /// file is now (PostgreSQL, in-memory databases and `file:` URIs are not followed).
    pub(crate) fn of(pool: &SqlPool) -> Option<Self> {
        let options = match pool {
            SqlPool::Sqlite(pool) => pool.connect_options(),
            #[cfg(feature = "rules-postgres")]
            SqlPool::Postgres(_) => return None,
        };
        let path = std::path::absolute(options.get_filename()).ok()?;
        let meta = std::fs::metadata(&path).ok()?;
        meta.is_file().then(|| Self {
            id: FileId::of(&meta),
            path,
        })
    }

    /// Makes `pool` read the file now at the path: nothing to do while it is the file the
    /// pool opened; a new pool (with the same options) when another file is there. An
    /// error, naming the path, when the file is gone or unreadable, or the new one cannot
    /// be opened: then nothing should be read from the old file (the next call tries
    /// again).
    pub(crate) async fn follow(
        &mut self,
        pool: &mut SqlPool,
        timeout: Duration,
    ) -> Result<(), String> {
        let now = self.look()?;
        if now == self.id {
            return Ok(());
        }
        let reopened = match &*pool {
            SqlPool::Sqlite(old) => old
                .options()
                .clone()
                .connect_with((*old.connect_options()).clone()),
            #[cfg(feature = "rules-postgres")]
            SqlPool::Postgres(_) => return Ok(()),
        };
        let new = match tokio::time::timeout(timeout, reopened).await {
            Ok(Ok(new)) => new,
            Ok(Err(e)) => {
                return Err(format!(
                    "the database file {} was replaced, and the new one cannot be opened: {e}",
                    self.path.display()
                ));
            }
            Err(_) => {
                return Err(format!(
                    "the database file {} was replaced, and opening the new one timed out \
                     ({timeout:?})",
                    self.path.display()
                ));
            }
        };
        // The old pool is left to its other holders (an audit sink, the application):
        // closing it here would close it for them.
        *pool = SqlPool::Sqlite(new);
        self.id = now;
        tracing::info!(
            target: "tollgate::rules",
            file = %self.path.display(),
            "the rules database file was replaced: reading the new one"
        );
        Ok(())
    }

    /// ` from <path>`, for errors.
    pub(crate) fn describe(&self) -> String {
        format!(" from {}", self.path.display())
    }

    /// The file now at the path, if it is there and readable.
    fn look(&self) -> Result<FileId, String> {
        let path = self.path.display();
        let meta = std::fs::metadata(&self.path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                format!("the database file {path} is gone (deleted or moved away)")
            } else {
                format!("the database file {path} cannot be read: {e}")
            }
        })?;
        if !meta.is_file() {
            return Err(format!("{path} is no longer a file"));
        }
        readable(&meta).map_err(|why| format!("the database file {path} cannot be read: {why}"))?;
        Ok(FileId::of(&meta))
    }
}

/// Whether the file may be read, asked without opening it (closing any descriptor of a
/// database file drops the locks SQLite holds on it in this process): a file whose mode
/// lets no one read it (`chmod 000`) is unreadable, even for root, who could read it
/// anyway: its owner has taken it away. (A file readable by others but not by this
/// process is not noticed here: SQLite reports it when it next opens the file.)
#[cfg(unix)]
fn readable(meta: &Metadata) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode();
    if mode & 0o444 == 0 {
        return Err(format!(
            "its mode ({:03o}) lets no one read it",
            mode & 0o777
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn readable(_meta: &Metadata) -> Result<(), String> {
    Ok(())
}
