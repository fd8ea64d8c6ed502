//! Generates the Rust of etcd's wire interface from `proto/` at build
//! time: protox (a protobuf compiler written in Rust, so no `protoc`)
//! parses the files into a descriptor set; tonic-build (through
//! prost-build) writes the messages, the service traits and servers and the
//! clients; pbjson-build writes their JSON mapping (serde) with the proto
//! field names, as etcd's JSON gateway speaks it. Everything lands in
//! `OUT_DIR`, one file per package, which `src/lib.rs` includes.

use std::path::PathBuf;

const FILES: [&str; 3] = [
    "etcdserverpb/rpc.proto",
    "mvccpb/kv.proto",
    "authpb/auth.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for f in FILES {
        println!("cargo:rerun-if-changed=proto/{f}");
    }
    let fds = protox::compile(FILES, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let bytes = prost::Message::encode_to_vec(&fds);
    std::fs::write(out.join("descriptors.bin"), &bytes)?;
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&bytes)?
        .preserve_proto_field_names()
        .build(&[".etcdserverpb", ".mvccpb", ".authpb"])?;
    Ok(())
}
