//! The tower middleware: the layer and its builder, the service, its response future,
//! the request guards, and gRPC refusals. Nothing in the crate imports this layer but
//! the configuration front-ends (rules), through its public builder.

pub(crate) mod body;
pub(crate) mod builder;
pub(crate) mod events;
pub(crate) mod future;
#[cfg(feature = "grpc")]
pub mod grpc;
pub(crate) mod guard;
pub(crate) mod handles;
pub(crate) mod layer;
pub(crate) mod pace;
pub(crate) mod routed;
pub(crate) mod service;
pub(crate) mod settle;
pub(crate) mod shared;
pub(crate) mod source;
#[cfg(feature = "ws")]
pub(crate) mod ws;
