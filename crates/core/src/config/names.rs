//! The names and defaults every part of config loading agrees on: the files and environment
//! variables looked at, reserved names, and the interaction ceiling's default.

use std::time::Duration;

use toolwarden_protocol::{ConfigFile, DurationValue};

/// The environment variable that names the config file when `--config` is not given.
pub const CONFIG_ENV: &str = "TOOLWARDEN_CONFIG";
/// The file looked for in the working directory when neither `--config` nor
/// `$TOOLWARDEN_CONFIG` names one.
pub const DEFAULT_FILE: &str = "toolwarden.toml";
/// The environment variable that overrides `[defaults].timeout`.
pub const TOOL_TIMEOUT_ENV: &str = "TOOLWARDEN_TOOL_TIMEOUT";
/// The `file` of diagnostics about environment variables.
pub(crate) const ENV_FILE: &str = "environment";
/// The server name of toolwarden's own tools (`toolwarden__status`).
pub(crate) const RESERVED_SERVER: &str = "toolwarden";
pub use toolwarden_protocol::EXEC_TOOL;
/// The default of `interaction_ceiling`.
pub const DEFAULT_INTERACTION_CEILING: Duration = Duration::from_secs(15 * 60);

/// `interaction_ceiling` of a file, defaulted.
pub(crate) fn ceiling(file: &ConfigFile) -> Duration {
    file.interaction_ceiling
        .map_or(DEFAULT_INTERACTION_CEILING, DurationValue::duration)
}
