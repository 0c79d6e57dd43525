//! Compiles the hand-written Envoy protocol files with a pure-Rust protobuf
//! compiler, so building needs no system `protoc`.

use std::path::PathBuf;

use prost::Message;

const PROTOS: &[&str] = &[
    "proto/envoy/service/ratelimit/v3/rls.proto",
    "proto/envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "proto/envoy/config/core/v3/base.proto",
    "proto/envoy/type/v3/ratelimit_unit.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // Server reflection serves this set (it includes the well-known types).
    std::fs::write(out.join("tollgate_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .include_file("tollgate_proto.rs")
        .compile_fds(fds)?;
    Ok(())
}
