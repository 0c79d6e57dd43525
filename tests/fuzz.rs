//! Property tests over hostile input: arbitrary bytes sent as a
//! `ShouldRateLimit` request to a real server over gRPC, and arbitrary rule
//! files. Nothing may panic; every request gets a well-formed answer or a
//! gRPC error with a message, and the server keeps serving. A request whose
//! descriptors match the rules gets a decision whatever values and costs a
//! client put in it: only what the operator's Envoy configuration controls
//! (descriptor counts, keys) may be an error.

mod support;

use std::path::Path;
use std::time::Duration;

use bytes::{Buf, BufMut};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;
use prost::Message;
use support::tollgate::Tollgate;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

const RULES: &str = r#"
domain: fuzz
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: fixed_window}
    descriptors:
      - key: b
        value: "x*y"
        rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window_log}
  - key: c
    value: "*"
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: d
    rate_limit: {unlimited: true}
  - key: q
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2, name: q}
  - key: s
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: q}]}
"#;

/// Sends and receives raw message bytes, so the server decodes what the
/// test made up.
#[derive(Clone, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

async fn send(channel: Channel, bytes: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(PATH);
    grpc.unary(tonic::Request::new(bytes), path, Raw)
        .await
        .map(|r| r.into_inner())
}

/// A request as the server reads it: entries as bytes. Only what the
/// checks need; prost skips the rest.
#[derive(Clone, PartialEq, prost::Message)]
struct LenientRequest {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<LenientDescriptor>,
    #[prost(uint32, tag = "3")]
    hits_addend: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LenientDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<LenientEntry>,
    #[prost(message, optional, tag = "3")]
    hits_addend: Option<UInt64Value>,
    #[prost(bool, tag = "4")]
    is_negative_hits: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LenientEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// The answer to `bytes` is either a valid response that fits the request,
/// or an error a caller can act on.
fn check_answer(bytes: &[u8], answer: Result<Vec<u8>, tonic::Status>) -> Result<(), String> {
    match answer {
        Ok(body) => {
            let response =
                RateLimitResponse::decode(&body[..]).map_err(|e| format!("bad response: {e}"))?;
            if response.overall_code != 1 && response.overall_code != 2 {
                return Err(format!("overall code {}", response.overall_code));
            }
            // Values are read as bytes (they need not be UTF-8).
            let request = LenientRequest::decode(bytes)
                .map_err(|e| format!("answered an undecodable request: {e}"))?;
            if response.statuses.len() != request.descriptors.len() {
                return Err(format!(
                    "{} statuses for {} descriptors",
                    response.statuses.len(),
                    request.descriptors.len()
                ));
            }
            Ok(())
        }
        Err(status) => {
            let fine = match status.code() {
                tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted => true,
                // tonic's answer to bytes that are not a protobuf message.
                tonic::Code::Internal => status.message().contains("decode"),
                _ => false,
            };
            if fine && !status.message().is_empty() {
                Ok(())
            } else {
                Err(format!("unexpected error {status:?}"))
            }
        }
    }
}

fn entry() -> impl Strategy<Value = Entry> {
    let key = prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("c".to_string()),
        Just("d".to_string()),
        Just("q".to_string()),
        Just("s".to_string()),
        ".{0,12}",
    ];
    let value = prop_oneof![Just("xzy".to_string()), Just(String::new()), ".{0,40}"];
    (key, value).prop_map(|(key, value)| Entry { key, value })
}

fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
    (
        prop::collection::vec(entry(), 0..4),
        prop::option::of((any::<u32>(), -2i32..10)),
        prop::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(|(entries, limit, hits, negative)| RateLimitDescriptor {
            entries,
            limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit,
            }),
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        })
}

fn request() -> impl Strategy<Value = RateLimitRequest> {
    (
        prop_oneof![Just("fuzz".to_string()), ".{0,10}"],
        prop::collection::vec(descriptor(), 0..6),
        any::<u32>(),
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

/// Valid messages, valid messages with bytes flipped or cut, and noise.
fn request_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        request().prop_map(|r| r.encode_to_vec()),
        (
            request(),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)
        )
            .prop_map(|(r, flips)| {
                let mut bytes = r.encode_to_vec();
                if !bytes.is_empty() {
                    for (at, b) in flips {
                        let i = at.index(bytes.len());
                        bytes[i] = b;
                    }
                }
                bytes
            }),
        (request(), any::<prop::sample::Index>()).prop_map(|(r, cut)| {
            let mut bytes = r.encode_to_vec();
            let n = cut.index(bytes.len() + 1);
            bytes.truncate(n);
            bytes
        }),
        prop::collection::vec(any::<u8>(), 0..300),
    ]
}

#[test]
fn arbitrary_request_bytes_get_an_answer_or_a_grpc_error() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(Tollgate::start(
        &[("fuzz.yaml", RULES)],
        &[("max_descriptors", "4"), ("max_value_bytes", "32")],
    ));
    let channel = rt.block_on(async {
        Channel::from_shared(format!("http://{}", server.grpc))
            .unwrap()
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap()
    });
    let config = ProptestConfig {
        cases: 400,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(bytes in request_bytes())| {
        let answer = rt.block_on(send(channel.clone(), bytes.clone()));
        if let Err(why) = check_answer(&bytes, answer) {
            prop_assert!(false, "{why} for request bytes {bytes:?}");
        }
    });
    // Still serving after all of that.
    let ok = RateLimitRequest {
        domain: "fuzz".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "d".into(),
                value: "v".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let answer = rt.block_on(send(channel, ok.encode_to_vec())).unwrap();
    let response = RateLimitResponse::decode(&answer[..]).unwrap();
    assert_eq!(response.statuses[0].limit_remaining, u32::MAX);
    rt.block_on(server.stop());
}

/// Values a client could put in a header or path: short, long, and bytes
/// that are not UTF-8.
fn client_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..40),
        Just(b"xzy".to_vec()),
        (any::<u8>(), 200usize..70_000).prop_map(|(b, n)| vec![b; n]),
        prop::collection::vec(128u8.., 1..8),
    ]
}

/// A descriptor of the rules' own keys (what the operator's Envoy sends)
/// with values a client chose, and any cost.
fn matching_descriptor() -> impl Strategy<Value = LenientDescriptor> {
    let keys = prop_oneof![
        Just(vec!["a"]),
        Just(vec!["a", "b"]),
        Just(vec!["c"]),
        Just(vec!["d"]),
        Just(vec!["q"]),
        Just(vec!["s"]),
    ];
    (
        keys,
        prop::collection::vec(client_value(), 2),
        prop::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(|(keys, values, hits, negative)| LenientDescriptor {
            entries: keys
                .iter()
                .zip(values)
                .map(|(k, value)| LenientEntry {
                    key: k.as_bytes().to_vec(),
                    value,
                })
                .collect(),
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        })
}

/// The property Envoy's fail-open default asks for: a request whose
/// descriptors match the rules, whatever values and costs the client put
/// in them, gets a decision, never an error.
#[test]
fn matching_requests_get_a_decision_whatever_the_client_sent() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(Tollgate::start(&[("fuzz.yaml", RULES)], &[]));
    let channel = rt.block_on(async {
        Channel::from_shared(format!("http://{}", server.grpc))
            .unwrap()
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap()
    });
    let config = ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(
        descriptors in prop::collection::vec(matching_descriptor(), 1..8),
        hits_addend in any::<u32>(),
    )| {
        let request = LenientRequest {
            domain: "fuzz".into(),
            descriptors,
            hits_addend,
        };
        let answer = rt.block_on(send(channel.clone(), request.encode_to_vec()));
        match answer {
            Ok(body) => {
                let response = RateLimitResponse::decode(&body[..]).unwrap();
                prop_assert!(response.overall_code == 1 || response.overall_code == 2);
                prop_assert_eq!(response.statuses.len(), request.descriptors.len());
            }
            Err(status) => prop_assert!(false, "an error for a matching request: {:?}", status),
        }
    });
    rt.block_on(server.stop());
}

/// YAML-shaped rule files from the rule grammar's own words plus junk.
fn rule_yaml() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        Just("domain"),
        Just("descriptors"),
        Just("key"),
        Just("value"),
        Just("rate_limit"),
        Just("unit"),
        Just("requests_per_unit"),
        Just("unit_multiplier"),
        Just("unlimited"),
        Just("name"),
        Just("replaces"),
        Just("algorithm"),
        Just("buckets"),
        Just("shards"),
        Just("on_store_error"),
        Just("shadow_mode"),
        Just("quota_mode"),
        Just("detailed_metric"),
        Just("junk"),
    ];
    let scalar = prop_oneof![
        Just("second".to_string()),
        Just("hour".to_string()),
        Just("year".to_string()),
        Just("sliding_window_log".to_string()),
        Just("sliding_window_counter".to_string()),
        Just("true".to_string()),
        Just("~".to_string()),
        Just("-1".to_string()),
        Just("99999999999999999999".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("\"*\"".to_string()),
        "[a-z*]{0,6}",
        "[0-9]{1,12}",
    ];
    let line = (0usize..4, any::<bool>(), word, scalar).prop_map(|(indent, dash, word, value)| {
        let pad = "  ".repeat(indent);
        let dash = if dash { "- " } else { "" };
        format!("{pad}{dash}{word}: {value}")
    });
    prop::collection::vec(line, 0..16).prop_map(|lines| lines.join("\n"))
}

#[test]
fn arbitrary_rule_files_load_or_fail_with_errors() {
    let config = ProptestConfig {
        cases: 1500,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let file = Path::new("fuzz.yaml");
    let options = tollgate::rules::LoadOptions {
        default_algorithm: tollgate::limit::Algorithm::SlidingWindowLog,
        max_log_limit: 1000,
        merge_domains: false,
        count_refused: true,
    };
    proptest!(config, |(text in prop_oneof![
        rule_yaml(),
        prop::collection::vec(any::<u8>(), 0..200)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ], probe in prop::collection::vec(("[a-z]{1,2}", "[a-z*]{0,3}"), 1..4))| {
        match tollgate::rules::parse_file(file, &text, &options) {
            Ok(domain) => {
                // A loaded file answers lookups without panicking.
                let mut set = tollgate::rules::RuleSet::default();
                let name = domain.name.clone();
                set.domains.insert(name.clone(), domain);
                let entries: Vec<(String, String)> = probe;
                let _ = set.find(&name, &entries);
            }
            Err(errors) => {
                prop_assert!(!errors.0.is_empty());
                for e in &errors.0 {
                    let shown = e.to_string();
                    prop_assert!(shown.starts_with("fuzz.yaml"), "{shown}");
                }
            }
        }
    });
}
