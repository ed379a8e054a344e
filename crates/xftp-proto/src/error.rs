use thiserror::Error;

/// Everything that can be wrong with control-channel input.
///
/// Each variant is caused by the peer (or the user who typed an argument);
/// none is an internal failure.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    /// A command or reply line longer than the limit (peer misbehaved).
    #[error("line longer than {limit} bytes")]
    LineTooLong {
        /// The limit that was exceeded.
        limit: usize,
    },
    /// A reply line that does not start with a three-digit code.
    #[error("malformed reply line: {0:?}")]
    BadReply(String),
    /// A command verb that is not ASCII letters.
    #[error("malformed command verb")]
    BadVerb,
    /// A required argument is missing.
    #[error("{0} needs an argument")]
    MissingArgument(&'static str),
    /// An argument that does not parse (number, host-port, type code).
    #[error("invalid argument for {verb}: {reason}")]
    BadArgument {
        /// The command whose argument was bad.
        verb: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A path argument that contains a NUL byte or otherwise cannot name a file.
    #[error("invalid path: {0}")]
    BadPath(&'static str),
}
