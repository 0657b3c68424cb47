//! The `leasehold` command.

fn main() {}
