//! What an `[exec]` section resolves to.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toolwarden_protocol::ExecConfig;

/// Output kept per call when `output_limit` is not configured (stdout and stderr together).
pub const DEFAULT_OUTPUT_LIMIT: u64 = 1024 * 1024;
/// The shell when `shell` is not configured.
pub const DEFAULT_SHELL: &str = "sh";
/// How long output is still read after the command's shell exited.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Environment variables a command never inherits from toolwarden, by default: the HTTP API's
/// bearer token would let a model approve its own calls.
pub const DEFAULT_ENV_REMOVE: &[&str] = &["TOOLWARDEN_TOKEN"];

/// The exec tool's settings, resolved and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecSettings {
    /// A command's working directory must lie under one of these (absolute, canonical).
    pub allowed_roots: Vec<PathBuf>,
    /// A relative `cwd` resolves against this, and a call without `cwd` runs here (absolute,
    /// canonical). It is checked against `allowed_roots` like any other `cwd`.
    pub base_dir: PathBuf,
    /// Output bytes kept per call, stdout and stderr together; the middle of a longer output is
    /// cut. `0` keeps nothing (every byte is counted as cut).
    pub output_limit: u64,
    /// The shell, run as `SHELL -c COMMAND` (looked up in `PATH` unless it is a path).
    pub shell: String,
    /// After the shell exited, how long its output is still read (background processes may hold
    /// the pipes open); then the rest of its process group is killed.
    pub drain_timeout: Duration,
    /// Environment variables removed from what a command inherits (the input's `env` may still
    /// set them). The binary adds the configured `[http] token_env` here.
    pub env_remove: Vec<String>,
}

/// Why an `[exec]` section cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ExecConfigError {
    /// The base directory does not exist or cannot be resolved.
    #[error("[exec] base directory {}: {cause}", path.display())]
    BaseDir {
        /// The base directory as given.
        path: PathBuf,
        /// What failed.
        cause: io::Error,
    },
    /// An `allowed_roots` entry does not exist or cannot be resolved.
    #[error("[exec] allowed_roots entry {root:?} ({}) cannot be used: {cause}", path.display())]
    RootNotFound {
        /// The entry as written.
        root: String,
        /// The entry resolved against the base directory.
        path: PathBuf,
        /// What failed.
        cause: io::Error,
    },
    /// An `allowed_roots` entry is not a directory.
    #[error("[exec] allowed_roots entry {root:?} ({}) is not a directory", path.display())]
    RootNotADirectory {
        /// The entry as written.
        root: String,
        /// The entry, canonical.
        path: PathBuf,
    },
    /// `allowed_roots = []`: no command could run anywhere.
    #[error(
        "[exec] allowed_roots is empty, so no command could run anywhere; \
         remove the key for the default [\".\"] or name a directory"
    )]
    NoRoots,
    /// `shell = ""`.
    #[error("[exec] shell is empty")]
    EmptyShell,
}

impl ExecSettings {
    /// Resolves `[exec]`: `allowed_roots` (default `["."]`) against `base_dir`, canonicalized;
    /// a root that does not exist is an error naming it. Reads the file system.
    pub fn from_config(cfg: &ExecConfig, base_dir: &Path) -> Result<Self, ExecConfigError> {
        let base_dir =
            std::fs::canonicalize(base_dir).map_err(|cause| ExecConfigError::BaseDir {
                path: base_dir.to_path_buf(),
                cause,
            })?;
        let written = cfg
            .allowed_roots
            .clone()
            .unwrap_or_else(|| vec![".".to_owned()]);
        if written.is_empty() {
            return Err(ExecConfigError::NoRoots);
        }
        let mut allowed_roots: Vec<PathBuf> = Vec::with_capacity(written.len());
        for root in written {
            let path = base_dir.join(&root);
            let canonical =
                std::fs::canonicalize(&path).map_err(|cause| ExecConfigError::RootNotFound {
                    root: root.clone(),
                    path: path.clone(),
                    cause,
                })?;
            if !canonical.is_dir() {
                return Err(ExecConfigError::RootNotADirectory {
                    root,
                    path: canonical,
                });
            }
            if !allowed_roots.contains(&canonical) {
                allowed_roots.push(canonical);
            }
        }
        let shell = cfg
            .shell
            .clone()
            .unwrap_or_else(|| DEFAULT_SHELL.to_owned());
        if shell.trim().is_empty() {
            return Err(ExecConfigError::EmptyShell);
        }
        Ok(Self {
            allowed_roots,
            base_dir,
            output_limit: cfg
                .output_limit
                .map_or(DEFAULT_OUTPUT_LIMIT, |size| size.bytes()),
            shell,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            env_remove: DEFAULT_ENV_REMOVE.iter().map(|&v| v.to_owned()).collect(),
        })
    }

    /// The allowed roots, for messages: `/a, /b`.
    pub(crate) fn roots_list(&self) -> String {
        self.allowed_roots
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use toolwarden_protocol::SizeValue;

    #[test]
    fn defaults_resolve_against_the_base_dir() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let settings = ExecSettings::from_config(&ExecConfig::default(), dir.path()).unwrap();
        assert_eq!(
            settings,
            ExecSettings {
                allowed_roots: vec![base.clone()],
                base_dir: base,
                output_limit: DEFAULT_OUTPUT_LIMIT,
                shell: "sh".to_owned(),
                drain_timeout: DEFAULT_DRAIN_TIMEOUT,
                env_remove: vec!["TOOLWARDEN_TOKEN".to_owned()],
            }
        );
    }

    #[test]
    fn roots_are_canonical_and_deduplicated() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(base.join("a")).unwrap();
        std::os::unix::fs::symlink(base.join("a"), base.join("link")).unwrap();
        let cfg = ExecConfig {
            allowed_roots: Some(vec![
                "a".to_owned(),
                "./link/../a".to_owned(),
                "link".to_owned(),
                base.display().to_string(),
            ]),
            output_limit: Some(SizeValue(-5)),
            shell: Some("bash".to_owned()),
            ..ExecConfig::default()
        };
        let settings = ExecSettings::from_config(&cfg, &base).unwrap();
        assert_eq!(settings.allowed_roots, vec![base.join("a"), base.clone()]);
        assert_eq!(settings.output_limit, 0);
        assert_eq!(settings.shell, "bash");
    }

    #[test]
    fn a_missing_root_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ExecConfig {
            allowed_roots: Some(vec![".".to_owned(), "nope".to_owned()]),
            ..ExecConfig::default()
        };
        let err = ExecSettings::from_config(&cfg, dir.path()).unwrap_err();
        assert!(matches!(&err, ExecConfigError::RootNotFound { root, .. } if root == "nope"));
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn a_file_is_not_a_root() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let cfg = ExecConfig {
            allowed_roots: Some(vec!["f".to_owned()]),
            ..ExecConfig::default()
        };
        let err = ExecSettings::from_config(&cfg, dir.path()).unwrap_err();
        assert!(matches!(err, ExecConfigError::RootNotADirectory { .. }));
    }

    #[test]
    fn empty_roots_and_empty_shell_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let no_roots = ExecConfig {
            allowed_roots: Some(vec![]),
            ..ExecConfig::default()
        };
        assert!(matches!(
            ExecSettings::from_config(&no_roots, dir.path()),
            Err(ExecConfigError::NoRoots)
        ));
        let no_shell = ExecConfig {
            shell: Some(" ".to_owned()),
            ..ExecConfig::default()
        };
        assert!(matches!(
            ExecSettings::from_config(&no_shell, dir.path()),
            Err(ExecConfigError::EmptyShell)
        ));
        let missing_base =
            ExecSettings::from_config(&ExecConfig::default(), &dir.path().join("missing"));
        assert!(matches!(missing_base, Err(ExecConfigError::BaseDir { .. })));
    }
}
