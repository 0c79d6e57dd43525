//! Compiles the hand-written Envoy protocol files with a pure-Rust protobuf
//! compiler, so building needs no system `protoc`.
//!
//! The Rust types are generated from a copy of the descriptor set in which
//! a descriptor entry's `key` and `value` are `bytes` instead of `string`.
//! Both are the same length-delimited field on the wire, so nothing changes
//! for any client, and reflection still serves the published `string`
//! types; but Envoy may forward header bytes that are not UTF-8
//! (envoyproxy/envoy#16254), and a `string` field would make prost refuse
//! the whole request. `service` decides what such a value means instead.

use std::path::PathBuf;

use prost::Message;
use prost_types::field_descriptor_proto::Type;

const PROTOS: &[&str] = &[
    "proto/envoy/service/ratelimit/v3/rls.proto",
    "proto/envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "proto/envoy/config/core/v3/base.proto",
    "proto/envoy/type/v3/ratelimit_unit.proto",
    "proto/envoy/service/rate_limit_quota/v3/rlqs.proto",
];

/// The xDS client's messages (rules over ADS): generated with the others,
/// but not in the set reflection serves, as tollgate serves none of them.
const XDS_PROTOS: &[&str] = &[
    "proto/envoy/service/discovery/v3/discovery.proto",
    "proto/ratelimit/config/ratelimit/v3/rls_conf.proto",
];

/// The message whose fields are read as bytes, and those fields.
const ENTRY_PACKAGE: &str = "envoy.extensions.common.ratelimit.v3";
const ENTRY_PATH: [&str; 2] = ["RateLimitDescriptor", "Entry"];
const ENTRY_FIELDS: [&str; 2] = ["key", "value"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // Server reflection serves this set (it includes the well-known types).
    std::fs::write(out.join("tollgate_descriptor.bin"), fds.encode_to_vec())?;
    let mut generated = protox::compile(PROTOS.iter().chain(XDS_PROTOS), ["proto"])?;
    let mut patched = 0;
    for file in &mut generated.file {
        if file.package() != ENTRY_PACKAGE {
            continue;
        }
        let Some(outer) = file
            .message_type
            .iter_mut()
            .find(|m| m.name() == ENTRY_PATH[0])
        else {
            continue;
        };
        let Some(entry) = outer
            .nested_type
            .iter_mut()
            .find(|m| m.name() == ENTRY_PATH[1])
        else {
            continue;
        };
        for field in &mut entry.field {
            if ENTRY_FIELDS.contains(&field.name()) && field.r#type() == Type::String {
                field.set_type(Type::Bytes);
                patched += 1;
            }
        }
    }
    if patched != ENTRY_FIELDS.len() {
        return Err(format!(
            "expected to read {ENTRY_FIELDS:?} of {ENTRY_PACKAGE}.{} as bytes, found {patched}",
            ENTRY_PATH.join(".")
        )
        .into());
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .include_file("tollgate_proto.rs")
        .compile_fds(generated)?;
    Ok(())
}
