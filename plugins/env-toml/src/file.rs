//! The env file: a bounded read, TOML into entries, every problem with `file:line`.
//!
//! ```toml
//! [env]                        # defaults: the process environment wins
//! NCCL_SOCKET_IFNAME = "eth0"
//! NCCL_BUFFSIZE = 8388608      # integers are written in decimal
//! NCCL_IB_DISABLE = false      # booleans become "1" / "0"
//!
//! [pinned]                     # fleet pins: the file wins
//! NCCL_NET_PLUGIN = "cclkit-socket"
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ::toml::de::{DeTable, DeValue};

use crate::text::{cut, name_problem};

/// Largest env file read (1 MiB); a bigger one is refused, never truncated.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Longest value accepted, in bytes.
pub const MAX_VALUE_BYTES: usize = 4096;
/// Problems spelled out in one error message; the rest are counted.
const PROBLEMS_SHOWN: usize = 8;

/// The table an entry came from, which decides its precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    /// `[env]`: a default; a value in the process environment wins over it.
    Env,
    /// `[pinned]`: wins over the process environment.
    Pinned,
}

impl Section {
    /// The table header as written in the file.
    pub fn header(self) -> &'static str {
        match self {
            Section::Env => "[env]",
            Section::Pinned => "[pinned]",
        }
    }
}

/// One variable of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value as NCCL will read it.
    pub value: String,
    /// 1-based line of the variable's name.
    pub line: u32,
    /// `[env]` or `[pinned]`.
    pub section: Section,
}

/// One problem found in a file; `line` is `None` for the file as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line, if the problem has one.
    pub line: Option<u32>,
    /// What is wrong, naming the variable where there is one.
    pub message: String,
}

/// Why a file was refused: every problem found, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it (never empty).
    pub problems: Vec<Problem>,
}

impl FileError {
    fn whole(path: &Path, message: impl Into<String>) -> Self {
        Self {
            path: path.to_owned(),
            problems: vec![Problem {
                line: None,
                message: message.into(),
            }],
        }
    }
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = self.path.display();
        for (i, p) in self.problems.iter().take(PROBLEMS_SHOWN).enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match p.line {
                Some(line) => write!(f, "{path}:{line}: {}", p.message)?,
                None => write!(f, "{path}: {}", p.message)?,
            }
        }
        if self.problems.len() > PROBLEMS_SHOWN {
            write!(
                f,
                "; and {} more problems",
                self.problems.len() - PROBLEMS_SHOWN
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for FileError {}

/// Byte offset → 1-based line.
struct Lines(Vec<usize>);

impl Lines {
    fn new(text: &str) -> Self {
        Self(
            text.bytes()
                .enumerate()
                .filter_map(|(i, b)| (b == b'\n').then_some(i))
                .collect(),
        )
    }

    fn of(&self, offset: usize) -> u32 {
        u32::try_from(self.0.partition_point(|nl| *nl < offset) + 1).unwrap_or(u32::MAX)
    }
}

/// A parsed env file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFile {
    path: PathBuf,
    entries: BTreeMap<String, Entry>,
}

impl EnvFile {
    /// Reads and parses `path`: a regular file of at most [`MAX_FILE_BYTES`], UTF-8.
    pub fn load(path: &Path) -> Result<Self, FileError> {
        let text = read_bounded(path)?;
        Self::parse(path, &text)
    }

    /// Parses `text` as the contents of `path` (used in messages only).
    pub fn parse(path: &Path, text: &str) -> Result<Self, FileError> {
        let lines = Lines::new(text);
        let root = DeTable::parse(text).map_err(|e| FileError {
            path: path.to_owned(),
            problems: vec![Problem {
                line: Some(e.span().map_or(1, |s| lines.of(s.start))),
                message: format!("invalid TOML: {}", e.message().trim()),
            }],
        })?;
        let mut problems = Vec::new();
        let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
        let mut problem = |line: u32, message: String| {
            problems.push(Problem {
                line: Some(line),
                message,
            })
        };
        for (key, table) in root.get_ref().iter() {
            let key_line = lines.of(key.span().start);
            let section = match key.get_ref().as_ref() {
                "env" => Section::Env,
                "pinned" => Section::Pinned,
                other if other.starts_with("NCCL_") => {
                    problem(
                        key_line,
                        format!(
                            "{} is outside a table: put it under [env] (the process \
                             environment wins) or [pinned] (the file wins)",
                            cut(other)
                        ),
                    );
                    continue;
                }
                other => {
                    problem(
                        key_line,
                        format!(
                            "unknown top-level key `{}` (expected [env] or [pinned])",
                            cut(other)
                        ),
                    );
                    continue;
                }
            };
            let DeValue::Table(table) = table.get_ref() else {
                problem(key_line, format!("`{}` must be a table", section.header()));
                continue;
            };
            for (name, value) in table.iter() {
                let line = lines.of(name.span().start);
                let name = name.get_ref().as_ref();
                if let Some(why) = name_problem(name) {
                    problem(line, why);
                    continue;
                }
                if name == "NCCL_ENV_PLUGIN" {
                    problem(
                        line,
                        "NCCL_ENV_PLUGIN is read from the process environment before any \
                         env plugin loads; it cannot be set here"
                            .to_owned(),
                    );
                    continue;
                }
                let value = match render(value.get_ref()) {
                    Ok(v) => v,
                    Err(why) => {
                        problem(lines.of(value.span().start), format!("{name}: {why}"));
                        continue;
                    }
                };
                if let Some(why) = value_problem(&value) {
                    problem(line, format!("{name}: {why}"));
                    continue;
                }
                if let Some(first) = entries.get(name) {
                    problem(
                        line,
                        format!(
                            "{name} is set in both {} (line {}) and {}",
                            first.section.header(),
                            first.line,
                            section.header()
                        ),
                    );
                    continue;
                }
                entries.insert(
                    name.to_owned(),
                    Entry {
                        value,
                        line,
                        section,
                    },
                );
            }
        }
        if problems.is_empty() {
            Ok(Self {
                path: path.to_owned(),
                entries,
            })
        } else {
            problems.sort_by_key(|p| p.line);
            Err(FileError {
                path: path.to_owned(),
                problems,
            })
        }
    }

    /// The file this came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry for `name`, if the file sets it.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.get(name)
    }

    /// Every entry, by name.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(n, e)| (n.as_str(), e))
    }

    /// Number of variables the file sets.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if the file sets no variable.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A TOML value as NCCL reads it: strings as written, integers in decimal, booleans
/// as `1`/`0` (NCCL parses numeric parameters with `strtoll`, so `true` would read as 0).
fn render(value: &DeValue<'_>) -> Result<String, String> {
    match value {
        DeValue::String(s) => Ok(s.to_string()),
        DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
            .map(|n| n.to_string())
            .map_err(|_| "the integer does not fit in 64 bits".to_owned()),
        DeValue::Boolean(b) => Ok(if *b { "1" } else { "0" }.to_owned()),
        other => Err(format!(
            "a value must be a string, integer or boolean, not {}",
            other.type_str()
        )),
    }
}

fn value_problem(value: &str) -> Option<String> {
    if value.len() > MAX_VALUE_BYTES {
        return Some(format!(
            "the value is {} bytes long, above the limit of {MAX_VALUE_BYTES} (starts `{}`)",
            value.len(),
            cut(value)
        ));
    }
    // NUL would cut the C string; other control characters have no place in an NCCL
    // setting and could forge log lines.
    value
        .chars()
        .find(|c| c.is_control() && *c != '\t')
        .map(|c| {
            format!(
                "the value contains the control character {c:?} (`{}`)",
                cut(value)
            )
        })
}

/// Reads at most [`MAX_FILE_BYTES`] of a regular file, without blocking on a FIFO.
fn read_bounded(path: &Path) -> Result<String, FileError> {
    let mut file = OpenOptions::new()
        .read(true)
        // A FIFO named by mistake must not hang NCCL's initialisation in open().
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| FileError::whole(path, format!("cannot open: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| FileError::whole(path, format!("cannot stat: {e}")))?;
    if !meta.is_file() {
        return Err(FileError::whole(path, "not a regular file"));
    }
    let too_big = |size: u64| {
        FileError::whole(
            path,
            format!(
                "the file is {size} bytes; the limit is {MAX_FILE_BYTES} bytes (1 MiB), \
                 so it was not read"
            ),
        )
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::new();
    // The size can change between stat and read; never read past the limit.
    (&mut file)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| FileError::whole(path, format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|b| **b == b'\n').count() + 1;
        FileError {
            path: path.to_owned(),
            problems: vec![Problem {
                line: Some(u32::try_from(line).unwrap_or(u32::MAX)),
                message: "not valid UTF-8".to_owned(),
            }],
        }
    })
}
