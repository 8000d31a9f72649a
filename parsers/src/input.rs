//! Reading an input — a file, `-` for stdin, a FIFO, a device — the one way every command reads
//! one, and the one cap on what a collector's command may print.
//!
//! * Size: at most [`Limits::max_size`] bytes. A larger input is an error naming the limit; a
//!   regular file is refused by its size before it is read, anything else once the limit is
//!   reached, holding no more than the limit (the buffer never grows past it).
//! * Time: what may never end — stdin, a FIFO, a pipe, a device — is read on a thread of its
//!   own, and a wait of more than [`Limits::idle`] for its next bytes (or, for a FIFO, for a
//!   writer to open it) is an error. The thread stays blocked (and would take the bytes of a
//!   writer that comes later): inputs are read once, as a command starts, and the command that
//!   gets the error ends. Regular files are read directly.
//!
//! The binary sets the limits once ([`set_limits`], from `--max-input-size` and
//! `--read-timeout`); everything else reads them with [`limits`].

use std::io::Read;
use std::path::Path;
use std::sync::RwLock;
use std::time::Duration;

/// How much an input may hold and how long its next bytes may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most bytes one input may hold.
    pub max_size: u64,
    /// The longest wait for the next bytes of an input that is not a regular file; `None`:
    /// wait as long as it takes.
    pub idle: Option<Duration>,
}

/// The default size limit: 1 GiB, some twenty times the `iptables-save` output of a node with
/// 10,000 services.
pub const DEFAULT_MAX_SIZE: u64 = 1 << 30;

/// The default wait for the next bytes of a FIFO, pipe or stdin: long enough for
/// `kubectl get … -o json` of a large cluster, which prints nothing until it has listed all.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(120);

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_size: DEFAULT_MAX_SIZE,
            idle: Some(DEFAULT_IDLE),
        }
    }
}

static LIMITS: RwLock<Limits> = RwLock::new(Limits {
    max_size: DEFAULT_MAX_SIZE,
    idle: Some(DEFAULT_IDLE),
});

/// Sets the limits every later read of this process uses.
pub fn set_limits(limits: Limits) {
    *LIMITS
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = limits;
}

/// The limits reads use now ([`Limits::default`] unless [`set_limits`] changed them).
pub fn limits() -> Limits {
    *LIMITS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why an input could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The operating system refused (no such file, permission, …).
    #[error("reading {name}: {source}")]
    Io {
        /// The input (`<stdin>` or the path).
        name: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The input holds more than the size limit.
    #[error(
        "{name} holds more than {}, the input size limit (--max-input-size raises it)",
        size_text(*limit)
    )]
    TooLarge {
        /// The input.
        name: String,
        /// The limit, in bytes.
        limit: u64,
    },
    /// Nothing came from the input for longer than the wait.
    #[error(
        "{name}: nothing to read for {} (a FIFO or pipe that nothing writes to?); --read-timeout sets how long to wait",
        duration_text(*after)
    )]
    Idle {
        /// The input.
        name: String,
        /// The wait.
        after: Duration,
    },
    /// The input is not UTF-8 text where text is needed.
    #[error("{name} is not UTF-8 text (byte {offset} is not)")]
    NotText {
        /// The input.
        name: String,
        /// The 0-based offset of the first byte that is not.
        offset: usize,
    },
}

/// An input's bytes and the name messages use for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// `<stdin>` or the path as given.
    pub name: String,
    /// What it holds.
    pub bytes: Vec<u8>,
}

impl Input {
    /// The bytes as text (an error naming the first byte that is not UTF-8).
    pub fn into_text(self) -> Result<(String, String), InputError> {
        match String::from_utf8(self.bytes) {
            Ok(text) => Ok((text, self.name)),
            Err(e) => Err(InputError::NotText {
                offset: e.utf8_error().valid_up_to(),
                name: self.name,
            }),
        }
    }
}

/// The name of `path` in messages: `<stdin>` for `-`.
pub fn name_of(path: &Path) -> String {
    if path.as_os_str() == "-" {
        "<stdin>".to_string()
    } else {
        path.display().to_string()
    }
}

/// Reads `path` (`-` = stdin) whole, within [`limits`].
pub fn read(path: &Path) -> Result<Input, InputError> {
    read_with(path, limits())
}

/// [`read`] as text: (text, name).
pub fn read_text(path: &Path) -> Result<(String, String), InputError> {
    read(path)?.into_text()
}

/// Reads `path` (`-` = stdin) whole, within `limits`.
pub fn read_with(path: &Path, limits: Limits) -> Result<Input, InputError> {
    let mut source = open_with(path, limits)?;
    let expected = source.size_hint();
    let bytes = read_all(&mut source, &name_of(path), limits.max_size, expected)?;
    Ok(Input {
        name: name_of(path),
        bytes,
    })
}

/// Reads `reader` to its end, at most `max_size` bytes (`expected` of them reserved at once),
/// through a [`Gather`]: the one loop inputs and the files of a bundle are read with. Its errors
/// name `name` ([`InputError::from_io`]).
pub fn read_all(
    reader: &mut impl Read,
    name: &str,
    max_size: u64,
    expected: usize,
) -> Result<Vec<u8>, InputError> {
    let mut gather = Gather::new(name, max_size, expected);
    let mut chunk = vec![0u8; CHUNK];
    loop {
        match reader.read(&mut chunk) {
            Ok(0) => return Ok(gather.finish()),
            Ok(n) => gather.push(&chunk[..n])?,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(InputError::from_io(name, e)),
        }
    }
}

/// Opens `path` (`-` = stdin) for reading as a stream (a bundle's archive), within [`limits`].
pub fn open(path: &Path) -> Result<Source, InputError> {
    open_with(path, limits())
}

/// [`open`] within `limits`.
pub fn open_with(path: &Path, limits: Limits) -> Result<Source, InputError> {
    let name = name_of(path);
    let io = |source| InputError::Io {
        name: name.clone(),
        source,
    };
    let regular = path.as_os_str() != "-" && std::fs::metadata(path).map_err(io)?.is_file();
    let (kind, size) = if regular {
        let file = std::fs::File::open(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        if size > limits.max_size {
            return Err(InputError::TooLarge {
                name,
                limit: limits.max_size,
            });
        }
        (SourceKind::File(file), size)
    } else {
        (
            SourceKind::Stream(Stream::start(path, &name, limits.idle)),
            0,
        )
    };
    Ok(Source {
        inner: Capped::new(kind, &name, limits.max_size),
        name,
        size,
    })
}

/// How much a read asks for at once.
const CHUNK: usize = 1 << 16;

/// An open input: reading it past the size limit, or waiting past the idle limit, is an
/// error ([`InputError::from_io`] says which).
pub struct Source {
    name: String,
    size: u64,
    inner: Capped<SourceKind>,
}

enum SourceKind {
    /// A regular file.
    File(std::fs::File),
    /// Anything else, read on a thread of its own.
    Stream(Stream),
}

impl Read for SourceKind {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            SourceKind::File(file) => file.read(buf),
            SourceKind::Stream(stream) => stream.read(buf),
        }
    }
}

impl Source {
    /// The input's name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The size of a regular file (what to reserve), 0 for a stream.
    fn size_hint(&self) -> usize {
        usize::try_from(self.size).unwrap_or(0)
    }
}

impl Read for Source {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf)
    }
}

/// A reader that fails once more than `max` bytes came through it, without asking for more
/// than one byte past it: a size limit on a stream (an input, an archive unpacked), whose
/// error names the stream ([`InputError::from_io`]) whatever reads it on.
pub struct Capped<R> {
    inner: R,
    name: String,
    read: u64,
    max: u64,
}

impl<R: Read> Capped<R> {
    /// `inner`, named `name` in messages, limited to `max` bytes.
    pub fn new(inner: R, name: &str, max: u64) -> Capped<R> {
        Capped {
            inner,
            name: name.to_string(),
            read: 0,
            max,
        }
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // One byte more than the limit may be asked for: that it came is how the limit shows.
        let room = self.max.saturating_sub(self.read).saturating_add(1);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.read += n as u64;
        if self.read > self.max {
            return Err(std::io::Error::other(Exceeded::Size {
                name: self.name.clone(),
                limit: self.max,
            }));
        }
        Ok(n)
    }
}

/// Which limit a read of which stream went past (carried inside an `io::Error` through
/// [`Read`] and the decoders around it).
#[derive(Debug, thiserror::Error)]
enum Exceeded {
    #[error("{name}: more than {limit} bytes")]
    Size { name: String, limit: u64 },
    #[error("{name}: no bytes for {after:?}")]
    Idle { name: String, after: Duration },
}

impl InputError {
    /// What an error of reading through [`Source`] or [`Capped`] (possibly passed on by a
    /// decoder around them) stands for: a limit, naming the stream that passed it, or the
    /// operating system's error, naming `name`.
    pub fn from_io(name: &str, e: std::io::Error) -> InputError {
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<Exceeded>())
        {
            Some(Exceeded::Size { name, limit }) => InputError::TooLarge {
                name: name.clone(),
                limit: *limit,
            },
            Some(Exceeded::Idle { name, after }) => InputError::Idle {
                name: name.clone(),
                after: *after,
            },
            None => InputError::Io {
                name: name.to_string(),
                source: e,
            },
        }
    }
}

/// A stream read on a thread of its own, handed over in chunks.
struct Stream {
    chunks: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    name: String,
    idle: Option<Duration>,
    /// The rest of the last chunk.
    pending: Vec<u8>,
    at: usize,
}

impl Stream {
    fn start(path: &Path, name: &str, idle: Option<Duration>) -> Stream {
        // Few chunks in flight: a reader that stops reading stops the thread soon after.
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let path = path.to_path_buf();
        std::thread::spawn(move || {
            let opened: std::io::Result<Box<dyn Read>> = if path.as_os_str() == "-" {
                Ok(Box::new(std::io::stdin()))
            } else {
                // Opening a FIFO waits for a writer: here, where the wait is timed.
                std::fs::File::open(&path).map(|f| Box::new(f) as Box<dyn Read>)
            };
            let mut reader = match opened {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            loop {
                let mut chunk = vec![0u8; CHUNK];
                match reader.read(&mut chunk) {
                    Ok(0) => return,
                    Ok(n) => {
                        chunk.truncate(n);
                        if tx.send(Ok(chunk)).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                }
            }
        });
        Stream {
            chunks: rx,
            name: name.to_string(),
            idle,
            pending: Vec::new(),
            at: 0,
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::sync::mpsc::RecvTimeoutError;
        while self.at == self.pending.len() {
            let next = match self.idle {
                Some(idle) => self.chunks.recv_timeout(idle),
                None => self
                    .chunks
                    .recv()
                    .map_err(|_| RecvTimeoutError::Disconnected),
            };
            match next {
                Ok(chunk) => {
                    self.pending = chunk?;
                    self.at = 0;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(0),
                Err(RecvTimeoutError::Timeout) => {
                    return Err(std::io::Error::other(Exceeded::Idle {
                        name: self.name.clone(),
                        after: self.idle.unwrap_or_default(),
                    }));
                }
            }
        }
        let n = buf.len().min(self.pending.len() - self.at);
        buf[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Bytes gathered up to a size limit: the one accumulator of inputs and of the output of
/// collectors' commands. Bytes of unknown length are kept in blocks, each as large as all before
/// it (up to [`BLOCK_MAX`]), never copied into a larger buffer while they come: a growing buffer
/// would hold its old copies too (the allocator keeps freed memory), about twice the limit when
/// an endless input reaches it. One buffer is made of them at the end.
#[derive(Debug)]
pub struct Gather {
    name: String,
    blocks: Vec<Vec<u8>>,
    len: usize,
    max_size: u64,
}

/// The first block of bytes of unknown length.
const BLOCK_MIN: usize = 1 << 16;
/// The largest block.
const BLOCK_MAX: usize = 64 << 20;

impl Gather {
    /// Gathers `name`'s bytes, at most `max_size`; `expected` (a file's size) is reserved at
    /// once, so that bytes of known length are one block.
    pub fn new(name: &str, max_size: u64, expected: usize) -> Gather {
        let cap = usize::try_from(max_size).unwrap_or(usize::MAX);
        Gather {
            name: name.to_string(),
            blocks: vec![Vec::with_capacity(expected.min(cap))],
            len: 0,
            max_size,
        }
    }

    /// Adds `chunk`; an error once the bytes would pass the limit.
    pub fn push(&mut self, mut chunk: &[u8]) -> Result<(), InputError> {
        if (self.len + chunk.len()) as u64 > self.max_size {
            return Err(InputError::TooLarge {
                name: self.name.clone(),
                limit: self.max_size,
            });
        }
        self.len += chunk.len();
        while !chunk.is_empty() {
            let room = self.blocks.last().map_or(0, |b| b.capacity() - b.len());
            if room == 0 {
                let size = self.len.clamp(BLOCK_MIN, BLOCK_MAX);
                self.blocks.push(Vec::with_capacity(size));
                continue;
            }
            let (now, later) = chunk.split_at(room.min(chunk.len()));
            if let Some(block) = self.blocks.last_mut() {
                block.extend_from_slice(now);
            }
            chunk = later;
        }
        Ok(())
    }

    /// The bytes gathered, in one buffer.
    pub fn finish(mut self) -> Vec<u8> {
        if self.blocks.len() == 1 {
            return self.blocks.pop().unwrap_or_default();
        }
        let mut all = Vec::with_capacity(self.len);
        for block in self.blocks {
            all.extend_from_slice(&block);
        }
        all
    }
}

/// `1 GiB`, `512 MiB`, `1000 bytes`: a size as the limit's messages give it.
pub fn size_text(bytes: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

/// `120 s`, `1.5 s`: a wait as the messages give it.
fn duration_text(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Reads a size as `--max-input-size` takes it: bytes, or a number with a unit — `Ki`, `Mi`,
/// `Gi`, `Ti` (also written `KiB`, …) in powers of 1024, `k`/`K`, `M`, `G`, `T` (also `KB`, …)
/// in powers of 1000, as Kubernetes quantities are written.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let bad = || {
        format!(
            "{text:?} is not a size: a number of bytes, or with a unit (Ki, Mi, Gi, Ti; k, M, G, T), e.g. 2Gi"
        )
    };
    let number: u64 = number.parse().map_err(|_| bad())?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "Ti" | "TiB" => 1 << 40,
        "k" | "K" | "KB" | "kB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        _ => return Err(bad()),
    };
    match number.checked_mul(factor) {
        Some(0) => Err(format!("{text:?}: the size limit must be above 0")),
        Some(n) => Ok(n),
        None => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_size: u64, idle_ms: u64) -> Limits {
        Limits {
            max_size,
            idle: Some(Duration::from_millis(idle_ms)),
        }
    }

    #[test]
    fn a_file_within_the_limit_is_read_whole_and_a_larger_one_refused_unread() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("dump");
        std::fs::write(&path, "*nat\nCOMMIT\n").unwrap_or_else(|e| panic!("{e}"));
        let input = read_with(&path, limits(12, 100)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(input.bytes, b"*nat\nCOMMIT\n");
        assert_eq!(input.name, path.display().to_string());
        let e = read_with(&path, limits(11, 100)).err();
        assert!(
            matches!(&e, Some(InputError::TooLarge { limit: 11, .. })),
            "{e:?}"
        );
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.ends_with(
                "holds more than 11 bytes, the input size limit (--max-input-size raises it)"
            ),
            "{text}"
        );
        let e = read_with(&dir.path().join("absent"), limits(11, 100)).err();
        assert!(matches!(e, Some(InputError::Io { .. })), "{e:?}");
    }

    #[test]
    fn a_device_without_end_stops_at_the_limit() {
        let e = read_with(Path::new("/dev/zero"), limits(3 << 20, 5_000)).err();
        assert!(
            matches!(&e, Some(InputError::TooLarge { limit, .. }) if *limit == 3 << 20),
            "{e:?}"
        );
    }

    #[test]
    fn a_pipe_nobody_writes_to_times_out_and_one_written_is_read() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        // A pipe, by its name in /dev/fd: a FIFO, as `<(…)` of a shell gives one.
        let (silent, _writer) = std::io::pipe().unwrap_or_else(|e| panic!("{e}"));
        let path = format!("/dev/fd/{}", silent.as_raw_fd());
        let started = std::time::Instant::now();
        let e = read_with(Path::new(&path), limits(1 << 20, 300)).err();
        assert!(
            matches!(&e, Some(InputError::Idle { after, .. }) if *after == Duration::from_millis(300)),
            "{e:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        let text = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.ends_with(&format!("{path}: nothing to read for 0.3 s (a FIFO or pipe that nothing writes to?); --read-timeout sets how long to wait")),
            "{text}"
        );
        // A writer that sends slowly, never pausing as long as the wait: read whole.
        let (reader, mut writer) = std::io::pipe().unwrap_or_else(|e| panic!("{e}"));
        let path = format!("/dev/fd/{}", reader.as_raw_fd());
        let sender = std::thread::spawn(move || {
            for i in 0..5 {
                std::thread::sleep(Duration::from_millis(50));
                let _ = writeln!(writer, "line {i}");
            }
        });
        let input =
            read_with(Path::new(&path), limits(1 << 20, 2_000)).unwrap_or_else(|e| panic!("{e}"));
        let _ = sender.join();
        assert_eq!(
            input.into_text().map(|t| t.0).ok().as_deref(),
            Some("line 0\nline 1\nline 2\nline 3\nline 4\n")
        );
    }

    #[test]
    fn gathering_keeps_the_bytes_in_order_and_stops_at_the_limit() {
        let limit = 3 * BLOCK_MIN as u64 + 7;
        let mut g = Gather::new("x", limit, 0);
        let mut want = Vec::new();
        for i in 0..limit {
            let byte = (i % 251) as u8;
            g.push(&[byte]).unwrap_or_else(|e| panic!("{e}"));
            want.push(byte);
        }
        assert!(matches!(g.push(&[1]), Err(InputError::TooLarge { .. })));
        // Blocks as large as all before them: few, and none copied while bytes came.
        let held: usize = g.blocks.iter().map(Vec::capacity).sum();
        assert!(held <= 2 * limit as usize, "{held}");
        assert!(g.blocks.len() <= 4, "{}", g.blocks.len());
        assert_eq!(g.finish(), want);
        // Bytes of known length: one block, handed over as it is.
        let mut g = Gather::new("x", 100, 10);
        g.push(b"0123456789").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.blocks.len(), 1);
        assert_eq!(g.finish(), b"0123456789");
    }

    #[test]
    fn sizes_read_as_kubernetes_quantities() {
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size("2Gi"), Ok(2 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("3G"), Ok(3_000_000_000));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1.5Gi").is_err());
        assert!(parse_size("99999999999Ti").is_err());
        assert_eq!(size_text(1 << 30), "1 GiB");
        assert_eq!(size_text(3 << 20), "3 MiB");
        assert_eq!(size_text(1000), "1000 bytes");
    }

    #[test]
    fn text_that_is_not_utf8_names_its_first_bad_byte() {
        let input = Input {
            name: "s".into(),
            bytes: b"ab\xffc".to_vec(),
        };
        let e = input.into_text().err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("s is not UTF-8 text (byte 2 is not)"));
    }
}
