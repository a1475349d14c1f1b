//! Configuration errors that point at the file, line, column and field at fault.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, as named on the command line.
    pub file: PathBuf,
    /// 1-based line of the offending node; 0 when the problem is not at one place (an
    /// unreadable file).
    pub line: u64,
    /// 1-based column of the offending node.
    pub column: u64,
    /// The field at fault (e.g. `rate_limit.unit`), when there is one.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    /// An error at a position in `file`.
    pub fn at(
        file: &Path,
        (line, column): (u64, u64),
        field: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            file: file.to_owned(),
            line,
            column,
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }

    /// An error about the whole file (it cannot be read).
    pub fn file(file: &Path, message: impl Into<String>) -> Self {
        Self::at(file, (0, 0), None, message)
    }
}

impl fmt::Display for ConfigError {
    /// `file:line:column: field: message`, as compilers print errors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        f.write_str(": ")?;
        if let Some(field) = &self.field {
            write!(f, "`{field}`: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in a set of configuration files (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}
