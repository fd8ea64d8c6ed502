//! etcd v3's gRPC wire interface as Rust: the messages, the service traits
//! with their tonic servers, and tonic clients, for the packages
//! `etcdserverpb` (the KV, Watch, Lease, Cluster, Maintenance and Auth
//! services), `mvccpb` (keys and events) and `authpb` (users and roles,
//! which the Auth messages name).
//!
//! # The interface matched: etcd 3.4
//!
//! The `.proto` files under `proto/` were written for this workspace to
//! etcd 3.4's gRPC API: the same package, service, method and message
//! names, field names and numbers and enum values — the interface facts
//! every compatible implementation shares, since a client built for etcd
//! (etcdctl, the Go, Rust, Python and Java clients) finds its calls by
//! them. They are not etcd's files: the layout, comments and wording are
//! ours, and etcd's gogoproto options and HTTP annotations (which change
//! nothing on the wire) are left out. `tests/wire.rs` pins a few encodings
//! byte for byte.
//!
//! # How the Rust is generated
//!
//! At build time (`build.rs`), with no `protoc` needed:
//! 1. [protox](https://docs.rs/protox), a protobuf compiler written in
//!    Rust, parses the three files into a `FileDescriptorSet`;
//! 2. tonic-build (through prost-build) turns it into the message structs
//!    and enums (prost), each service's `…_server` module (an async trait
//!    and a tower `Service` that serves it) and `…_client` module (a
//!    client over any tonic transport, `connect` on tonic's `Channel`);
//! 3. pbjson-build writes the messages' serde implementations: the
//!    protobuf JSON mapping with the **proto field names** (`range_end`,
//!    `create_revision`), 64-bit integers as strings, bytes as base64 and
//!    enums by name — what etcd's JSON gateway (`/v3/kv/range`, …) sends
//!    and takes (it also reads numbers for integers, enum numbers, and
//!    the lowerCamelCase names).
//!
//! The generated files land in `OUT_DIR`, one per package, and are
//! included below; [`FILE_DESCRIPTOR_SET`] is the encoded descriptor set
//! (for reflection).
//!
//! # Auth
//!
//! The Auth service is here because it is part of the interface (a client
//! may call it); raftkv does not serve it: there its calls answer
//! `Unimplemented`.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

/// etcd's keys and events (`mvccpb`): `KeyValue`, `Event`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod mvccpb {
    include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
    include!(concat!(env!("OUT_DIR"), "/mvccpb.serde.rs"));
}

/// etcd's users and roles (`authpb`), named by the Auth messages.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod authpb {
    include!(concat!(env!("OUT_DIR"), "/authpb.rs"));
    include!(concat!(env!("OUT_DIR"), "/authpb.serde.rs"));
}

/// etcd's client services (`etcdserverpb`): the messages, and for each
/// service `X` a module `x_server` (trait `X`, server `XServer`) and
/// `x_client` (`XClient`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod etcdserverpb {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.serde.rs"));
}

/// The encoded `FileDescriptorSet` of the three files (with source info).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

/// The version raftkv answers in `StatusResponse.version`: etcdctl and the
/// clients gate features on it, and the interface matched is etcd 3.4's.
pub const ETCD_VERSION: &str = "3.4.0";
