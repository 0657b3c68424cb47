//! Model checks of the leasehold protocol, run as tests: see
//! `tests/protocol.rs` for the model, its properties and its bounds.
