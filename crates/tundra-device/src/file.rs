//! A plain file or raw block device (placeholder until implemented).
