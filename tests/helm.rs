//! The Helm chart and the integration kit, checked with the real tools:
//! helm 3 and helm 4 lint and render the chart, `kubernetes-validate` checks
//! the manifests against the Kubernetes schemas, assertions read the parsed
//! objects, the environment the Deployment gives the container starts the
//! real binary, and the descriptors the Envoy and Istio examples produce are
//! answered by a running tollgate as the book's Envoy and Istio pages say.
//!
//! Needs helm 3 and 4 (`TOLLGATE_TEST_HELM3` / `TOLLGATE_TEST_HELM4`, see
//! scripts/fetch-helm.sh), `kubernetes-validate`, and Python 3 with PyYAML,
//! grpcio and grpcio-tools. A missing tool fails the test with how to get it.

mod support;

use support::free_port;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde_json::Value;
use support::helm::{
    NAMESPACE, RELEASE, chart, helm, helms, parse_manifests, require_python_module, root,
    run_within, template, text,
};
use support::process::{Proc, tollgate_bin};
use support::redis::RedisServer;
use support::tollgate::Tollgate;

fn example(path: &str) -> String {
    root().join("examples").join(path).display().to_string()
}

fn parse_file(path: &str) -> Value {
    let docs = parse_manifests(&std::fs::read_to_string(path).unwrap());
    assert_eq!(docs.len(), 1, "{path}: one document");
    docs.into_iter().next().unwrap()
}

/// Checks files of manifests against the Kubernetes 1.30 schemas, strictly
/// (unknown fields are errors).
fn kubernetes_validate(files: &[PathBuf]) -> Output {
    let found = Command::new("kubernetes-validate")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "kubernetes-validate is needed: `python3 -m pip install kubernetes-validate`"
    );
    let mut cmd = Command::new("kubernetes-validate");
    cmd.args(["--strict", "--kubernetes-version", "1.30.0", "--quiet"])
        .args(files);
    run_within(&mut cmd, Duration::from_secs(120))
}

struct Rendered {
    objects: Vec<Value>,
}

impl Rendered {
    fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let found = self.all(kind);
        assert_eq!(found.len(), 1, "one {kind}: {found:#?}");
        found[0]
    }

    fn has(&self, kind: &str) -> bool {
        !self.all(kind).is_empty()
    }

    fn pod(&self) -> &Value {
        &self.one("Deployment")["spec"]["template"]["spec"]
    }

    fn container(&self) -> &Value {
        let containers = self.pod()["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1);
        &containers[0]
    }

    /// The container's environment, by name (each entry as rendered).
    fn env(&self) -> BTreeMap<String, Value> {
        self.container()["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
            .collect()
    }

    fn env_value(&self, name: &str) -> Option<String> {
        self.env()
            .get(name)
            .map(|e| e["value"].as_str().unwrap_or_else(|| panic!("{e}")).into())
    }

    fn mount(&self, path: &str) -> Option<(&Value, &Value)> {
        let mount = self.container()["volumeMounts"]
            .as_array()?
            .iter()
            .find(|m| m["mountPath"] == path)?;
        let volume = self.pod()["volumes"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == mount["name"])?;
        Some((mount, volume))
    }

    fn service(&self, name: &str) -> &Value {
        self.all("Service")
            .into_iter()
            .find(|s| s["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Service {name}"))
    }

    /// The rule files of the chart's ConfigMap.
    fn rule_files(&self) -> BTreeMap<String, String> {
        self.one("ConfigMap")["data"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect()
    }
}

fn render(helm: &Path, args: &[&str]) -> (String, Rendered) {
    let yaml = template(helm, args).unwrap_or_else(|e| panic!("helm template {args:?}: {e}"));
    let objects = parse_manifests(&yaml);
    (yaml, Rendered { objects })
}

// ------------------------------------------------------------- variants ---

struct Variant {
    name: &'static str,
    args: Vec<String>,
    check: fn(&Rendered),
}

fn sets(pairs: &[&str]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|p| ["--set".to_string(), p.to_string()])
        .collect()
}

const STANDALONE: &[&str] = &[
    "redis.enabled=true",
    "redis.mode=standalone",
    "redis.addresses={redis-master.redis:6379}",
    "redis.existingSecret=redis-auth",
];

fn variants() -> Vec<Variant> {
    let with = |base: &[&str], more: &[&str]| {
        let mut v = sets(base);
        v.extend(sets(more));
        v
    };
    let mut rules_args = vec![
        "--set-file".to_string(),
        format!("rules.edge={}", example("envoy/rules/edge.yaml")),
    ];
    rules_args.extend(sets(&["rulesChecksumRollout=true"]));
    vec![
        Variant {
            name: "default",
            args: vec![],
            check: |r| {
                assert_eq!(r.env_value("TOLLGATE_STORE").as_deref(), Some("memory"));
                assert_eq!(r.one("Deployment")["spec"]["replicas"], 1);
                for kind in [
                    "HorizontalPodAutoscaler",
                    "PodDisruptionBudget",
                    "NetworkPolicy",
                    "ServiceMonitor",
                    "PrometheusRule",
                    "ConfigMap",
                ] {
                    assert!(!r.has(kind), "{kind} is off by default");
                }
                assert_eq!(r.all("Service").len(), 1, "no headless Service");
                assert!(r.env_value("TOLLGATE_RULES_DIR").is_none(), "no rules yet");
                assert!(!r.env().keys().any(|k| k.starts_with("OTEL_")));
                // Envoy needs gRPC only; the debug views stay on loopback
                // with values as digests.
                let svc = r.service("tollgate");
                let names: Vec<&str> = svc["spec"]["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p["name"].as_str().unwrap())
                    .collect();
                assert_eq!(names, ["grpc"], "only gRPC on the Service by default");
                assert!(r.env_value("TOLLGATE_DEBUG_ADDR").is_none());
                assert_eq!(
                    r.env_value("TOLLGATE_DEBUG_SHOW_VALUES").as_deref(),
                    Some("false")
                );
                assert!(r.env_value("TOLLGATE_ON_OVERLOAD").is_none());
                assert_eq!(
                    r.env_value("TOLLGATE_STARTUP_WAIT_MS").as_deref(),
                    Some("5000")
                );
            },
        },
        Variant {
            name: "redis standalone, password from an existing Secret",
            args: sets(STANDALONE),
            check: |r| {
                assert_eq!(
                    r.env_value("TOLLGATE_STORE").as_deref(),
                    Some("redis://redis-master.redis:6379")
                );
                assert_eq!(
                    r.env()["TOLLGATE_REDIS__PASSWORD"]["valueFrom"]["secretKeyRef"],
                    serde_json::json!({"name": "redis-auth", "key": "password"})
                );
                assert_eq!(
                    r.env_value("TOLLGATE_REDIS__KEY_PREFIX").as_deref(),
                    Some("tg2")
                );
                assert_eq!(
                    r.env_value("TOLLGATE_REDIS__COALESCE").as_deref(),
                    Some("true")
                );
            },
        },
        Variant {
            name: "redis sentinel",
            args: sets(&[
                "redis.enabled=true",
                "redis.mode=sentinel",
                "redis.addresses={s0.redis:26379,s1.redis:26379,s2.redis:26379}",
                "redis.sentinelMasterName=mymaster",
                "redis.existingSecret=redis-auth",
                "redis.existingSecretPasswordKey=redis-password",
                "replicaCount=3",
            ]),
            check: |r| {
                assert_eq!(
                    r.env_value("TOLLGATE_STORE").as_deref(),
                    Some(
                        "redis-sentinel://s0.redis:26379?sentinelServiceName=mymaster&node=s1.redis:26379&node=s2.redis:26379"
                    )
                );
                assert_eq!(
                    r.env()["TOLLGATE_REDIS__PASSWORD"]["valueFrom"]["secretKeyRef"]["key"],
                    "redis-password"
                );
                assert_eq!(r.one("Deployment")["spec"]["replicas"], 3);
            },
        },
        Variant {
            name: "redis cluster",
            args: sets(&[
                "redis.enabled=true",
                "redis.mode=cluster",
                "redis.addresses={c0.redis:6379,c1.redis:6379,c2.redis:6379}",
                "redis.keyPrefix=edge1",
                "redis.commandTimeoutMs=15",
            ]),
            check: |r| {
                assert_eq!(
                    r.env_value("TOLLGATE_STORE").as_deref(),
                    Some("redis-cluster://c0.redis:6379?node=c1.redis:6379&node=c2.redis:6379")
                );
                assert_eq!(
                    r.env_value("TOLLGATE_REDIS__KEY_PREFIX").as_deref(),
                    Some("edge1")
                );
                assert_eq!(
                    r.env_value("TOLLGATE_REDIS__COMMAND_TIMEOUT_MS").as_deref(),
                    Some("15")
                );
                assert!(!r.env().contains_key("TOLLGATE_REDIS__PASSWORD"));
            },
        },
        Variant {
            name: "closed: peers per port, overload denied, HTTP on the Service",
            args: sets(&[
                "networkPolicy.enabled=true",
                "networkPolicy.ingressFrom[0].namespaceSelector.matchLabels.role=edge",
                "networkPolicy.httpFrom[0].namespaceSelector.matchLabels.role=monitoring",
                "tollgate.onOverload=deny",
                "tollgate.debugShowValues=true",
                "service.exposeHttp=true",
            ]),
            check: |r| {
                let np = r.one("NetworkPolicy");
                let rule = |i: usize| &np["spec"]["ingress"][i];
                assert_eq!(rule(0)["ports"][0]["port"], "grpc");
                assert_eq!(
                    rule(0)["from"][0]["namespaceSelector"]["matchLabels"]["role"],
                    "edge"
                );
                assert_eq!(rule(1)["ports"][0]["port"], "http");
                assert_eq!(
                    rule(1)["from"][0]["namespaceSelector"]["matchLabels"]["role"],
                    "monitoring"
                );
                assert_eq!(r.env_value("TOLLGATE_ON_OVERLOAD").as_deref(), Some("deny"));
                assert_eq!(
                    r.env_value("TOLLGATE_DEBUG_SHOW_VALUES").as_deref(),
                    Some("true")
                );
                assert_eq!(r.service("tollgate")["spec"]["ports"][1]["name"], "http");
            },
        },
        Variant {
            name: "HPA, PDB, NetworkPolicy, headless Service, monitoring with its API",
            args: {
                let mut a = with(
                    STANDALONE,
                    &[
                        "autoscaling.enabled=true",
                        "podDisruptionBudget.enabled=true",
                        "networkPolicy.enabled=true",
                        "networkPolicy.restrictEgress=true",
                        "service.headless.enabled=true",
                        "metrics.enabled=true",
                        "metrics.serviceMonitor.enabled=true",
                        "metrics.prometheusRule.enabled=true",
                        "otlp.enabled=true",
                        "otlp.endpoint=http://otel-collector.observability:4317",
                        "tollgate.extraSettings.memory\\.max_limiters=1000000",
                        "priorityClassName=high",
                    ],
                );
                a.extend(["--api-versions".into(), "monitoring.coreos.com/v1".into()]);
                a
            },
            check: |r| {
                let deployment = r.one("Deployment");
                assert!(
                    deployment["spec"].get("replicas").is_none(),
                    "the HPA owns replicas"
                );
                let hpa = r.one("HorizontalPodAutoscaler");
                assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
                assert_eq!(
                    hpa["spec"]["scaleTargetRef"]["name"],
                    deployment["metadata"]["name"]
                );
                let labels = &r.one("Deployment")["spec"]["template"]["metadata"]["labels"];
                let selects = |selector: &Value| {
                    selector
                        .as_object()
                        .unwrap()
                        .iter()
                        .all(|(k, v)| &labels[k] == v)
                };
                let pdb = r.one("PodDisruptionBudget");
                assert!(selects(&pdb["spec"]["selector"]["matchLabels"]));
                assert_eq!(pdb["spec"]["maxUnavailable"], 1);
                let np = r.one("NetworkPolicy");
                assert!(selects(&np["spec"]["podSelector"]["matchLabels"]));
                let ports = |rule: usize| -> Vec<&Value> {
                    np["spec"]["ingress"][rule]["ports"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| &p["port"])
                        .collect()
                };
                assert_eq!(ports(0), ["grpc"]);
                assert_eq!(ports(1), ["http"]);
                // The ServiceMonitor needs the HTTP port on the Service.
                assert_eq!(r.service("tollgate")["spec"]["ports"][1]["name"], "http");
                assert_eq!(
                    np["spec"]["policyTypes"],
                    serde_json::json!(["Ingress", "Egress"])
                );
                let headless = r.service("tollgate-headless");
                assert_eq!(headless["spec"]["clusterIP"], "None");
                assert!(selects(&headless["spec"]["selector"]));
                let sm = r.one("ServiceMonitor");
                assert_eq!(sm["spec"]["endpoints"][0]["port"], "http");
                assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
                assert!(selects(&sm["spec"]["selector"]["matchLabels"]));
                assert!(r.has("PrometheusRule"));
                assert_eq!(
                    r.env_value("OTEL_EXPORTER_OTLP_ENDPOINT").as_deref(),
                    Some("http://otel-collector.observability:4317")
                );
                assert_eq!(
                    r.env_value("OTEL_SERVICE_NAME").as_deref(),
                    Some("tollgate")
                );
                // Whole numbers stay whole (Helm reads them as floats).
                assert_eq!(
                    r.env_value("TOLLGATE_MEMORY__MAX_LIMITERS").as_deref(),
                    Some("1000000")
                );
                assert_eq!(r.pod()["priorityClassName"], "high");
            },
        },
        Variant {
            name: "monitoring asked for where its API is missing",
            args: sets(&[
                "metrics.enabled=true",
                "metrics.serviceMonitor.enabled=true",
                "metrics.prometheusRule.enabled=true",
            ]),
            check: |r| {
                assert!(!r.has("ServiceMonitor"));
                assert!(!r.has("PrometheusRule"));
            },
        },
        Variant {
            name: "rules from values, checksum rollout",
            args: rules_args,
            check: |r| {
                let files = r.rule_files();
                assert_eq!(files.keys().collect::<Vec<_>>(), ["edge.yaml"]);
                assert_eq!(
                    files["edge.yaml"].trim_end(),
                    std::fs::read_to_string(example("envoy/rules/edge.yaml"))
                        .unwrap()
                        .trim_end()
                );
                let annotations =
                    &r.one("Deployment")["spec"]["template"]["metadata"]["annotations"];
                let sum = annotations["checksum/rules"].as_str().unwrap();
                assert_eq!(sum.len(), 64, "a sha256: {sum}");
                let (_, volume) = r.mount("/etc/tollgate/rules").unwrap();
                assert_eq!(
                    volume["configMap"]["name"],
                    r.one("ConfigMap")["metadata"]["name"]
                );
            },
        },
        Variant {
            name: "rules from an existing ConfigMap",
            args: sets(&["rulesExistingConfigMap=team-rules"]),
            check: |r| {
                assert!(!r.has("ConfigMap"));
                let (_, volume) = r.mount("/etc/tollgate/rules").unwrap();
                assert_eq!(volume["configMap"]["name"], "team-rules");
                assert_eq!(
                    r.env_value("TOLLGATE_RULES_DIR").as_deref(),
                    Some("/etc/tollgate/rules")
                );
                let annotations =
                    &r.one("Deployment")["spec"]["template"]["metadata"]["annotations"];
                assert!(annotations.get("checksum/rules").is_none());
            },
        },
        Variant {
            name: "Grafana dashboard for the sidecar in Grafana's namespace, linked from the alerts",
            args: {
                let mut a = sets(&[
                    "grafana.dashboards.enabled=true",
                    "grafana.dashboards.namespace=monitoring",
                    "grafana.dashboards.annotations.grafana_folder=Rate limits",
                    "grafana.dashboards.url=https://grafana.example.com/d/tollgate",
                    "metrics.enabled=true",
                    "metrics.prometheusRule.enabled=true",
                    "metrics.prometheusRule.rules[0].alert=Mine",
                    "metrics.prometheusRule.rules[0].expr=vector(1)",
                    "metrics.prometheusRule.rules[1].alert=MineLinked",
                    "metrics.prometheusRule.rules[1].expr=vector(1)",
                    "metrics.prometheusRule.rules[1].annotations.dashboard_url=https://elsewhere",
                    "metrics.prometheusRule.rules[2].record=mine:sum",
                    "metrics.prometheusRule.rules[2].expr=vector(1)",
                ]);
                a.extend(["--api-versions".into(), "monitoring.coreos.com/v1".into()]);
                a
            },
            check: |r| {
                let cm = r.one("ConfigMap");
                assert_eq!(cm["metadata"]["name"], "tollgate-dashboard");
                assert_eq!(cm["metadata"]["namespace"], "monitoring");
                let labels = &cm["metadata"]["labels"];
                assert_eq!(labels["grafana_dashboard"], "1");
                assert_eq!(labels["app.kubernetes.io/instance"], RELEASE);
                assert_eq!(
                    cm["metadata"]["annotations"],
                    serde_json::json!({"grafana_folder": "Rate limits"})
                );
                let data = cm["data"].as_object().unwrap();
                assert_eq!(data.keys().collect::<Vec<_>>(), ["tollgate.json"]);
                assert_eq!(
                    data["tollgate.json"].as_str().unwrap(),
                    std::fs::read_to_string(root().join("helm/tollgate/dashboards/tollgate.json"))
                        .unwrap(),
                    "the ConfigMap holds the file as it is"
                );
                let rules: Vec<&Value> = r.one("PrometheusRule")["spec"]["groups"][0]["rules"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .collect();
                let url = |i: usize| rules[i]["annotations"]["dashboard_url"].as_str();
                assert_eq!(rules[0]["alert"], "TollgateNotReady");
                assert_eq!(url(0), Some("https://grafana.example.com/d/tollgate"));
                assert_eq!(url(1), Some("https://grafana.example.com/d/tollgate"));
                assert_eq!(
                    url(2),
                    Some("https://elsewhere"),
                    "an alert's own link stays"
                );
                assert!(
                    rules[3].get("annotations").is_none(),
                    "a recording rule: none"
                );
            },
        },
        Variant {
            name: "Grafana dashboard under another sidecar label, no link from the alerts",
            args: {
                let mut a = sets(&[
                    "grafana.dashboards.enabled=true",
                    "grafana.dashboards.labels.grafana_dashboard=null",
                    "grafana.dashboards.labels.dashboards=1",
                    "metrics.enabled=true",
                    "metrics.prometheusRule.enabled=true",
                ]);
                a.extend(["--api-versions".into(), "monitoring.coreos.com/v1".into()]);
                a
            },
            check: |r| {
                let cm = r.one("ConfigMap");
                assert_eq!(cm["metadata"]["namespace"], NAMESPACE);
                let labels = &cm["metadata"]["labels"];
                assert!(labels.get("grafana_dashboard").is_none(), "{labels}");
                assert_eq!(labels["dashboards"], "1", "a label value is a string");
                assert!(cm["metadata"].get("annotations").is_none());
                let alert = &r.one("PrometheusRule")["spec"]["groups"][0]["rules"][0];
                assert!(alert["annotations"].get("dashboard_url").is_none());
            },
        },
        Variant {
            name: "TLS: Redis with a CA and a client certificate, gRPC with client auth",
            args: sets(&[
                "redis.enabled=true",
                "redis.mode=standalone",
                "redis.addresses={redis.example.com:6380}",
                "redis.username=tollgate",
                "redis.existingSecret=redis-auth",
                "redis.tls.enabled=true",
                "redis.tls.existingSecret=redis-tls",
                "redis.tls.clientCertificate=true",
                "grpcTls.enabled=true",
                "grpcTls.existingSecret=tollgate-grpc-tls",
                "grpcTls.clientAuth=true",
            ]),
            check: |r| {
                assert_eq!(
                    r.env_value("TOLLGATE_STORE").as_deref(),
                    Some("rediss://redis.example.com:6380")
                );
                assert_eq!(
                    r.env_value("TOLLGATE_REDIS__USERNAME").as_deref(),
                    Some("tollgate")
                );
                let (mount, volume) = r.mount("/etc/tollgate/redis-tls").unwrap();
                assert_eq!(volume["secret"]["secretName"], "redis-tls");
                assert_eq!(mount["readOnly"], true);
                for (var, file) in [
                    ("TOLLGATE_REDIS__TLS_CA_FILE", "ca.crt"),
                    ("TOLLGATE_REDIS__TLS_CERT_FILE", "tls.crt"),
                    ("TOLLGATE_REDIS__TLS_KEY_FILE", "tls.key"),
                ] {
                    assert_eq!(
                        r.env_value(var),
                        Some(format!("/etc/tollgate/redis-tls/{file}"))
                    );
                }
                let (mount, volume) = r.mount("/etc/tollgate/grpc-tls").unwrap();
                assert_eq!(volume["secret"]["secretName"], "tollgate-grpc-tls");
                assert!(
                    mount.get("subPath").is_none(),
                    "renewals must reach the pod"
                );
                for (var, file) in [
                    ("TOLLGATE_GRPC_TLS__CERT_FILE", "tls.crt"),
                    ("TOLLGATE_GRPC_TLS__KEY_FILE", "tls.key"),
                    ("TOLLGATE_GRPC_TLS__CLIENT_CA_FILE", "ca.crt"),
                ] {
                    assert_eq!(
                        r.env_value(var),
                        Some(format!("/etc/tollgate/grpc-tls/{file}"))
                    );
                }
                // Kubelet gRPC probes speak no TLS: readiness uses HTTP.
                let probe = &r.container()["readinessProbe"];
                assert_eq!(probe["httpGet"]["path"], "/healthcheck");
                assert!(probe.get("grpc").is_none());
            },
        },
    ]
}

/// What every rendering must hold, whatever the values.
fn check_invariants(r: &Rendered) {
    let pod = r.pod();
    assert_eq!(pod["enableServiceLinks"], false);
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = r.container();
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");

    let ports: BTreeMap<&str, &Value> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), &p["containerPort"]))
        .collect();
    assert_eq!(ports["grpc"], 8081);
    assert_eq!(ports["http"], 8080);
    assert_eq!(
        r.env_value("TOLLGATE_GRPC_ADDR").as_deref(),
        Some("0.0.0.0:8081")
    );
    assert_eq!(
        r.env_value("TOLLGATE_HTTP_ADDR").as_deref(),
        Some("0.0.0.0:8080")
    );

    let probe = &c["readinessProbe"];
    if probe.get("grpc").is_some() {
        assert_eq!(probe["grpc"]["port"], 8081);
        assert_eq!(probe["grpc"]["service"], "");
    } else {
        assert_eq!(probe["httpGet"]["path"], "/healthcheck");
        assert_eq!(probe["httpGet"]["port"], "http");
    }
    assert_eq!(c["livenessProbe"]["tcpSocket"]["port"], "http");

    let ms = |name: &str| -> u64 { r.env_value(name).unwrap().parse().unwrap() };
    let grace_s = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        grace_s * 1000 > ms("TOLLGATE_SHUTDOWN_DRAIN_MS") + ms("TOLLGATE_SHUTDOWN_GRACE_MS"),
        "terminationGracePeriodSeconds {grace_s} must exceed drain + grace"
    );

    // A password never sits in the Deployment: only a Secret reference.
    for (name, e) in r.env() {
        if name.contains("PASSWORD") {
            assert!(e.get("value").is_none(), "{name} inline: {e}");
            assert!(e["valueFrom"]["secretKeyRef"].is_object(), "{e}");
        }
    }

    // Rules, when any, are a directory mount (never subPath: those never
    // update) of the ConfigMap, at the directory tollgate reads.
    if let Some(dir) = r.env_value("TOLLGATE_RULES_DIR") {
        let (mount, volume) = r.mount(&dir).expect("the rules directory is mounted");
        assert!(mount.get("subPath").is_none());
        assert!(volume["configMap"]["name"].is_string());
    }
    assert!(r.mount("/tmp").is_some(), "a writable /tmp");

    let svc = r.service("tollgate");
    let svc_ports: BTreeMap<&str, &Value> = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p))
        .collect();
    assert_eq!(svc_ports["grpc"]["port"], 8081);
    assert_eq!(svc_ports["grpc"]["targetPort"], "grpc");
    assert_eq!(svc_ports["grpc"]["appProtocol"], "grpc");
    if let Some(http) = svc_ports.get("http") {
        assert_eq!(http["port"], 8080);
        assert_eq!(http["targetPort"], "http");
    }
    let labels = &pod_labels(r);
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "the Service selects the pods");
    }
}

fn pod_labels(r: &Rendered) -> Value {
    r.one("Deployment")["spec"]["template"]["metadata"]["labels"].clone()
}

/// Every documented variant renders with helm 3 and helm 4 to the same
/// objects, passes kubernetes-validate --strict, and holds the invariants
/// and its own expectations.
#[test]
fn every_variant_renders_validates_and_holds_its_fields() {
    let [h3, h4] = helms();
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, v) in variants().iter().enumerate() {
        let args: Vec<&str> = v.args.iter().map(String::as_str).collect();
        let (yaml, r3) = render(&h3, &args);
        let (_, r4) = render(&h4, &args);
        assert_eq!(r3.objects, r4.objects, "{}: helm 3 and 4 agree", v.name);
        check_invariants(&r3);
        (v.check)(&r3);
        let file = dir.path().join(format!("variant-{i}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        files.push(file);
    }
    let out = kubernetes_validate(&files);
    assert!(
        out.status.success(),
        "kubernetes-validate: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // The validator is not lenient: a misplaced field fails it.
    let broken = dir.path().join("broken.yaml");
    let (yaml, _) = render(&h3, &[]);
    std::fs::write(
        &broken,
        yaml.replacen("enableServiceLinks: false", "enableServiceLink: false", 1),
    )
    .unwrap();
    let out = kubernetes_validate(&[broken]);
    assert!(!out.status.success(), "an unknown field is refused");
}

/// `helm lint --strict` passes with helm 3 and helm 4, for the defaults and
/// for the variants.
#[test]
fn lint_strict_passes_with_helm_3_and_4() {
    let variants = variants();
    for helm in helms() {
        for v in variants
            .iter()
            .filter(|v| v.name != "default")
            .take(4)
            .chain(variants.iter().filter(|v| v.name == "default"))
        {
            // lint has no --api-versions: it renders without the optional APIs.
            let mut args = Vec::new();
            let mut rest = v.args.iter();
            while let Some(a) = rest.next() {
                if a == "--api-versions" {
                    rest.next();
                } else {
                    args.push(a);
                }
            }
            let mut cmd = Command::new(&helm);
            cmd.args(["lint", "--strict", &chart()]).args(args);
            let out = run_within(&mut cmd, Duration::from_secs(60));
            assert!(
                out.status.success(),
                "{} lint {}: {}{}",
                helm.display(),
                v.name,
                text(&out.stdout),
                text(&out.stderr)
            );
        }
    }
}

/// Values that cannot work stop the render with a message naming what to set.
#[test]
fn impossible_values_fail_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["redis.enabled=true", "redis.mode=cluster"],
            "redis.mode=cluster needs redis.addresses",
        ),
        (
            &[
                "redis.enabled=true",
                "redis.mode=standalone",
                "redis.addresses={redis:6379}",
                "redis.tls.enabled=true",
            ],
            "redis.tls.enabled needs the CA",
        ),
        (
            &[
                "redis.enabled=true",
                "redis.addresses={redis:6379}",
                "redis.password=hunter2",
            ],
            "redis.password must not be given inline",
        ),
        (
            &[
                "redis.enabled=true",
                "redis.mode=sentinel",
                "redis.addresses={s:26379}",
            ],
            "needs redis.sentinelMasterName",
        ),
        (
            &["redis.enabled=true", "redis.addresses={a:6379,b:6379}"],
            "redis.mode=standalone needs exactly one redis.addresses entry",
        ),
        (&["replicaCount=3"], "set redis.enabled=true"),
        (
            &["terminationGracePeriodSeconds=8"],
            "terminationGracePeriodSeconds=8 must exceed",
        ),
        (
            &["grpcTls.enabled=true"],
            "grpcTls.enabled needs grpcTls.existingSecret",
        ),
        // The schema's message (worded differently by helm 3 and 4).
        (&["redis.mode=primary"], "must be one of"),
    ];
    for helm in helms() {
        for (values, message) in cases {
            let err = template(
                &helm,
                &sets(values).iter().map(String::as_str).collect::<Vec<_>>(),
            )
            .expect_err(&format!("{values:?} must fail"));
            assert!(err.contains(message), "{values:?}: {err}");
            assert!(
                !err.contains("hunter2"),
                "the password is not echoed: {err}"
            );
        }
    }
    // A bad rule file name is refused too, and so is a key that --set-file
    // nested because of its dot.
    let err = template(&helm(3), &["--set", "rules.a/b=x"]).unwrap_err();
    assert!(err.contains("not a valid file name"), "{err}");
    let err = template(
        &helm(3),
        &[
            "--set-file",
            &format!("rules.edge.yaml={}", example("envoy/rules/edge.yaml")),
        ],
    )
    .unwrap_err();
    assert!(err.contains("rules.edge has no domain"), "{err}");
}

// --------------------------------------------------------------- rules ---

fn tollgate_validate(dir: &Path) -> String {
    let out = run_within(
        Command::new(tollgate_bin()).arg("validate").arg(dir),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "tollgate validate {}: {}",
        dir.display(),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn write_rules(files: &BTreeMap<String, String>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in files {
        std::fs::write(dir.path().join(name), content).unwrap();
    }
    dir
}

/// The ConfigMap the chart renders from the example rule files (given as
/// text with --set-file, and as a YAML object in a values file) passes
/// `tollgate validate`, and so does every example rules directory.
#[test]
fn rendered_and_example_rules_pass_validate() {
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        "rules:\n  inline.yml:\n    domain: inline\n    descriptors:\n      - key: k\n        rate_limit: {unit: minute, requests_per_unit: 10}\n",
    )
    .unwrap();
    let mut args = vec!["-f".to_string(), values.display().to_string()];
    for (name, path) in [
        ("edge", "envoy/rules/edge.yaml"),
        ("istio_gateway", "istio/rules/istio_gateway.yaml"),
        ("orders", "istio/rules/orders.yaml"),
        ("upstream_quota", "client/rules/upstream_quota.yaml"),
        ("demo", "rules/demo.yaml"),
    ] {
        args.push("--set-file".into());
        args.push(format!("rules.{name}={}", example(path)));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, r) = render(&helm(3), &args);
    let files = r.rule_files();
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        [
            "demo.yaml",
            "edge.yaml",
            "inline.yml",
            "istio_gateway.yaml",
            "orders.yaml",
            "upstream_quota.yaml"
        ]
    );
    let rules = write_rules(&files);
    let said = tollgate_validate(rules.path());
    assert!(
        said.contains(
            "6 domain(s) valid: demo, edge, inline, istio_gateway, orders, upstream_quota"
        ),
        "{said}"
    );
    for (dir, domains) in [
        ("rules", "edge_proxy, mongo_cps"),
        ("envoy/rules", "edge"),
        ("istio/rules", "istio_gateway, orders"),
        ("client/rules", "upstream_quota"),
    ] {
        let said = tollgate_validate(Path::new(&example(dir)));
        assert!(said.contains(domains), "{dir}: {said}");
    }
}

// ------------------------------------------------ the rendered environment ---

/// The variables the kubelet would add for the rendered Services if service
/// links were on (they are off; the binary must not mind either way).
fn service_links(r: &Rendered) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for (i, svc) in r.all("Service").into_iter().enumerate() {
        let name = svc["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_uppercase()
            .replace('-', "_");
        let ip = format!("10.96.0.{}", 10 + i);
        let ports = svc["spec"]["ports"].as_array().unwrap();
        let first = ports[0]["port"].as_u64().unwrap();
        env.push((format!("{name}_SERVICE_HOST"), ip.clone()));
        env.push((format!("{name}_SERVICE_PORT"), first.to_string()));
        env.push((format!("{name}_PORT"), format!("tcp://{ip}:{first}")));
        for p in ports {
            let port = p["port"].as_u64().unwrap();
            let pname = p["name"].as_str().unwrap().to_uppercase().replace('-', "_");
            env.push((format!("{name}_SERVICE_PORT_{pname}"), port.to_string()));
            let base = format!("{name}_PORT_{port}_TCP");
            env.push((base.clone(), format!("tcp://{ip}:{port}")));
            env.push((format!("{base}_PROTO"), "tcp".into()));
            env.push((format!("{base}_PORT"), port.to_string()));
            env.push((format!("{base}_ADDR"), ip.clone()));
        }
    }
    env
}

async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    text(&buf).split_whitespace().nth(1)?.parse().ok()
}

async fn grpc_health(addr: SocketAddr, service: &str) -> Option<i32> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let ch = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .ok()?
        .connect()
        .await
        .ok()?;
    HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .ok()
        .map(|r| r.into_inner().status)
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    support::tollgate::descriptor(entries)
}

async fn ask(
    addr: SocketAddr,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .should_rate_limit(RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Starts the binary with exactly the environment the rendered Deployment
/// gives its container (Secret references resolved from `secrets`) plus the
/// service-link variables of the rendered Services; only the listen
/// addresses move to loopback ports and the rules directory to a copy of the
/// rendered ConfigMap. Then probes it the way the rendered probes do and asks
/// it one question.
async fn start_rendered(
    r: &Rendered,
    secrets: &[(&str, &str, &str)],
) -> (Proc, SocketAddr, tempfile::TempDir) {
    let rules = write_rules(&r.rule_files());
    let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut env = vec![(
        "PATH".to_string(),
        std::env::var("PATH").unwrap_or_default(),
    )];
    for (name, e) in r.env() {
        let value = match name.as_str() {
            "TOLLGATE_GRPC_ADDR" => grpc.to_string(),
            "TOLLGATE_HTTP_ADDR" => http.to_string(),
            "TOLLGATE_RULES_DIR" => rules.path().display().to_string(),
            _ => match (e.get("value"), e["valueFrom"]["secretKeyRef"].as_object()) {
                (Some(v), _) => v.as_str().unwrap().to_string(),
                (None, Some(secret)) => secrets
                    .iter()
                    .find(|(s, k, _)| secret["name"] == *s && secret["key"] == *k)
                    .map(|(_, _, v)| v.to_string())
                    .unwrap_or_else(|| panic!("no Secret for {e}")),
                _ => panic!("an env entry this test cannot resolve: {e}"),
            },
        };
        env.push((name, value));
    }
    env.extend(service_links(r));
    let p = Proc::spawn(
        &r.container()["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect::<Vec<_>>(),
        &env.iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect::<Vec<_>>(),
    );

    // The readiness probe the chart renders: gRPC health "" on the gRPC port.
    let probe = &r.container()["readinessProbe"]["grpc"];
    assert_eq!(probe["port"], 8081);
    let service = probe["service"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while grpc_health(grpc, service).await != Some(1) {
        assert!(
            Instant::now() < deadline,
            "never SERVING; output: {:#?}",
            p.lines()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(http_status(http, "/healthcheck").await, Some(200));
    (p, grpc, rules)
}

/// The environment of the rendered Deployment (embedded store) starts the
/// binary, which serves the rendered rules, with the service-link variables
/// of a Service named `tollgate` around it and without a word about them.
#[tokio::test]
async fn the_rendered_environment_starts_and_serves() {
    let (_, r) = render(
        &helm(3),
        &[
            "--set-file",
            &format!("rules.edge={}", example("envoy/rules/edge.yaml")),
        ],
    );
    let links = service_links(&r);
    assert!(links.iter().any(|(k, _)| k == "TOLLGATE_PORT"), "{links:?}");
    let (p, grpc, _rules) = start_rendered(&r, &[]).await;
    let answer = ask(grpc, "edge", vec![descriptor(&[("api_key", "k")])]).await;
    assert_eq!(answer.overall_code, Code::Ok as i32);
    let limit = answer.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit),
        ("per_api_key", 5)
    );
    let lines = p.lines();
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("WARN") || l.contains("ERROR")),
        "{lines:#?}"
    );
}

/// Redis standalone with the password from a Secret: the rendered
/// environment (the Secret reference resolved as the kubelet would) reaches
/// a real password-protected Redis and counts there.
#[tokio::test]
async fn the_rendered_environment_reaches_redis_with_the_secret_password() {
    let redis = RedisServer::start();
    assert_eq!(
        redis.cli(&["CONFIG", "SET", "requirepass", "s3cret-pw"]),
        "OK"
    );
    let address = format!("redis.addresses={{127.0.0.1:{}}}", redis.port());
    let (_, r) = render(
        &helm(4),
        &[
            "--set",
            "redis.enabled=true",
            "--set",
            &address,
            "--set",
            "redis.existingSecret=redis-auth",
            "--set",
            "redis.keyPrefix=chart",
            "--set-file",
            &format!("rules.edge={}", example("envoy/rules/edge.yaml")),
        ],
    );
    let (_p, grpc, _rules) = start_rendered(&r, &[("redis-auth", "password", "s3cret-pw")]).await;
    for remaining in [4, 3] {
        let answer = ask(grpc, "edge", vec![descriptor(&[("api_key", "redis-k")])]).await;
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(answer.statuses[0].limit_remaining, remaining);
    }
    // The counters are in that Redis, under the chart's key prefix.
    let keys = support::redis::cli(
        redis.port(),
        &["-a", "s3cret-pw", "--no-auth-warning", "KEYS", "chart*"],
    );
    assert!(keys.contains("redis-k"), "{keys}");
}

// ------------------------------------------------------ Envoy and Istio ---

/// A request as Envoy sees it: the client's address and the headers
/// (pseudo-headers included).
struct HttpRequest<'a> {
    remote: &'a str,
    headers: &'a [(&'a str, &'a str)],
}

/// The descriptors Envoy builds from `rate_limits` for `req`: one per entry,
/// in order, entries in the order of the actions; a request_headers action
/// whose header is absent drops its whole descriptor (Envoy's default,
/// `skip_if_absent: false`).
fn envoy_descriptors(rate_limits: &Value, req: &HttpRequest) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    'limits: for limit in rate_limits.as_array().unwrap() {
        let mut entries = Vec::new();
        for action in limit["actions"].as_array().unwrap() {
            let (kind, spec) = action.as_object().unwrap().iter().next().unwrap();
            match kind.as_str() {
                "generic_key" => entries.push((
                    spec["descriptor_key"]
                        .as_str()
                        .unwrap_or("generic_key")
                        .to_string(),
                    spec["descriptor_value"].as_str().unwrap().to_string(),
                )),
                "remote_address" => entries.push(("remote_address".into(), req.remote.into())),
                "request_headers" => {
                    let name = spec["header_name"].as_str().unwrap();
                    match req
                        .headers
                        .iter()
                        .find(|(h, _)| h.eq_ignore_ascii_case(name))
                    {
                        Some((_, v)) => entries.push((
                            spec["descriptor_key"].as_str().unwrap().to_string(),
                            v.to_string(),
                        )),
                        None if spec["skip_if_absent"] == true => {}
                        None => continue 'limits,
                    }
                }
                other => panic!("the examples use an action this test does not model: {other}"),
            }
        }
        out.push(entries);
    }
    out
}

fn to_descriptors(built: &[Vec<(String, String)>]) -> Vec<RateLimitDescriptor> {
    built
        .iter()
        .map(|entries| RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            ..Default::default()
        })
        .collect()
}

fn pairs(entries: &[&[(&str, &str)]]) -> Vec<Vec<(String, String)>> {
    entries
        .iter()
        .map(|d| {
            d.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn rule_files_in(dir: &str) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(example(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

async fn serve_rules(dir: &str) -> Tollgate {
    let files = rule_files_in(dir);
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_str()))
        .collect();
    let t = Tollgate::start(&refs, &[]).await;
    t.wait_serving(Duration::from_secs(20)).await;
    t
}

fn find_filter<'a>(filters: &'a Value, name: &str) -> &'a Value {
    filters
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("no filter {name}"))
}

/// The Envoy example: its actions produce the descriptors docs/src/start/envoy.md
/// lists, in Envoy's order, and tollgate serving the example rules answers
/// them as the docs say (search limited at the third call, the API key at
/// the sixth, the internal key never; X-RateLimit-* material on every
/// limited status).
#[tokio::test]
async fn envoy_example_descriptors_get_the_documented_answers() {
    let envoy = parse_file(&example("envoy/envoy.yaml"));
    let hcm = &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    let rl = &find_filter(&hcm["http_filters"], "envoy.filters.http.ratelimit")["typed_config"];
    assert_eq!(rl["enable_x_ratelimit_headers"], "DRAFT_VERSION_03");
    assert_eq!(rl["rate_limit_service"]["transport_api_version"], "V3");
    let cluster_name = rl["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .unwrap();
    let domain = rl["domain"].as_str().unwrap();
    let cluster = envoy["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == cluster_name)
        .unwrap();
    assert!(
        cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            ["explicit_http_config"]["http2_protocol_options"]
            .is_object(),
        "gRPC needs HTTP/2"
    );
    assert_eq!(
        cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
            ["port_value"],
        8081
    );
    let rate_limits = &hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["rate_limits"];

    let search = HttpRequest {
        remote: "203.0.113.7",
        headers: &[(":path", "/search?q=tea"), ("x-api-key", "k-123")],
    };
    let built = envoy_descriptors(rate_limits, &search);
    assert_eq!(
        built,
        pairs(&[
            &[("generic_key", "edge"), ("remote_address", "203.0.113.7")],
            &[("api_key", "k-123")],
            &[("api_key", "k-123"), ("path", "/search?q=tea")],
        ])
    );

    let t = serve_rules("envoy/rules").await;
    let addr = t.grpc;
    for call in 1..=3u32 {
        let a = ask(addr, domain, to_descriptors(&built)).await;
        let names: Vec<&str> = a
            .statuses
            .iter()
            .map(|s| s.current_limit.as_ref().unwrap().name.as_str())
            .collect();
        assert_eq!(names, ["per_ip", "per_api_key", "search_per_api_key"]);
        for s in &a.statuses {
            assert!(s.duration_until_reset.is_some(), "Reset header material");
        }
        if call <= 2 {
            assert_eq!(a.overall_code, Code::Ok as i32, "search {call}");
            assert_eq!(a.statuses[2].limit_remaining, 2 - call);
            assert_eq!(a.statuses[1].limit_remaining, 5 - call);
        } else {
            assert_eq!(a.overall_code, Code::OverLimit as i32, "third search: 429");
            assert_eq!(a.statuses[2].code, Code::OverLimit as i32);
            assert_eq!(a.statuses[2].limit_remaining, 0);
            let reset = a.statuses[2].duration_until_reset.unwrap();
            assert!(reset.seconds > 0 && reset.seconds <= 60, "{reset:?}");
        }
    }

    // Another key on another path: the path level has no limit there, and
    // the sixth call in the minute is refused by per_api_key.
    let orders = HttpRequest {
        remote: "203.0.113.8",
        headers: &[(":path", "/orders"), ("x-api-key", "k-456")],
    };
    let built = envoy_descriptors(rate_limits, &orders);
    for call in 1..=6u32 {
        let a = ask(addr, domain, to_descriptors(&built)).await;
        assert!(
            a.statuses[2].current_limit.is_none(),
            "no limit for /orders"
        );
        if call <= 5 {
            assert_eq!(a.overall_code, Code::Ok as i32, "call {call}");
            assert_eq!(a.statuses[1].limit_remaining, 5 - call);
        } else {
            assert_eq!(a.overall_code, Code::OverLimit as i32, "sixth call: 429");
            assert_eq!(a.statuses[1].code, Code::OverLimit as i32);
        }
    }

    // No API key: one descriptor, the per-IP limit only.
    let anonymous = HttpRequest {
        remote: "198.51.100.1",
        headers: &[(":path", "/search")],
    };
    let built = envoy_descriptors(rate_limits, &anonymous);
    assert_eq!(
        built,
        pairs(&[&[("generic_key", "edge"), ("remote_address", "198.51.100.1")]])
    );
    let a = ask(addr, domain, to_descriptors(&built)).await;
    assert_eq!(a.overall_code, Code::Ok as i32);
    let limit = a.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (20, 1),
        "20 per second"
    );
    assert_eq!(a.statuses[0].limit_remaining, 19);

    // The internal key is never limited by its own descriptor.
    let internal = HttpRequest {
        remote: "10.0.0.5",
        headers: &[(":path", "/orders"), ("x-api-key", "internal-batch")],
    };
    let built = envoy_descriptors(rate_limits, &internal);
    for _ in 0..7 {
        let a = ask(addr, domain, to_descriptors(&built)).await;
        assert_eq!(a.overall_code, Code::Ok as i32);
        assert_eq!(a.statuses[1].limit_remaining, u32::MAX, "unlimited");
    }
    t.stop().await;
}

/// The Istio EnvoyFilters point at the chart's Service (its name and gRPC
/// port as rendered), name domains the example rules define, and their
/// actions' descriptors get the documented answers.
#[tokio::test]
async fn istio_examples_use_the_charts_service_and_their_rules_answer() {
    let (_, r) = render(&helm(3), &[]);
    let svc = r.service("tollgate");
    let port = svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "grpc")
        .unwrap()["port"]
        .as_u64()
        .unwrap();
    let host = format!(
        "{}.{NAMESPACE}.svc.cluster.local",
        svc["metadata"]["name"].as_str().unwrap()
    );
    let cluster = format!("outbound|{port}||{host}");

    let t = serve_rules("istio/rules").await;
    let mut actions = BTreeMap::new();
    for file in ["envoyfilter-gateway.yaml", "envoyfilter-sidecar.yaml"] {
        let filter = parse_file(&example(&format!("istio/{file}")));
        assert_eq!(filter["kind"], "EnvoyFilter");
        let patches = filter["spec"]["configPatches"].as_array().unwrap();
        let http = patches
            .iter()
            .find(|p| p["applyTo"] == "HTTP_FILTER")
            .unwrap();
        assert_eq!(http["patch"]["operation"], "INSERT_BEFORE");
        let cfg = &http["patch"]["value"]["typed_config"];
        let grpc = &cfg["rate_limit_service"]["grpc_service"]["envoy_grpc"];
        assert_eq!(grpc["cluster_name"], cluster.as_str(), "{file}");
        assert_eq!(grpc["authority"], host.as_str(), "{file}");
        assert_eq!(cfg["enable_x_ratelimit_headers"], "DRAFT_VERSION_03");
        let vhost = patches
            .iter()
            .find(|p| p["applyTo"] == "VIRTUAL_HOST")
            .unwrap();
        let domain = cfg["domain"].as_str().unwrap().to_string();
        actions.insert(domain, vhost["patch"]["value"]["rate_limits"].clone());
    }
    assert_eq!(
        actions.keys().collect::<Vec<_>>(),
        ["istio_gateway", "orders"],
        "the domains of examples/istio/rules"
    );

    // Gateway: per-IP and logins (5 per minute over all hosts).
    let login = HttpRequest {
        remote: "203.0.113.9",
        headers: &[(":authority", "shop.example.com"), (":path", "/login")],
    };
    let built = envoy_descriptors(&actions["istio_gateway"], &login);
    assert_eq!(
        built,
        pairs(&[
            &[("remote_address", "203.0.113.9")],
            &[("host", "shop.example.com"), ("path", "/login")],
        ])
    );
    for call in 1..=6u32 {
        let a = ask(t.grpc, "istio_gateway", to_descriptors(&built)).await;
        assert_eq!(a.statuses[0].current_limit.as_ref().unwrap().name, "per_ip");
        assert_eq!(a.statuses[1].current_limit.as_ref().unwrap().name, "logins");
        let want = if call <= 5 { Code::Ok } else { Code::OverLimit };
        assert_eq!(a.overall_code, want as i32, "login {call}");
    }

    // Sidecar: per tenant (acme has its own limit), and writes.
    let acme = HttpRequest {
        remote: "10.1.2.3",
        headers: &[(":method", "POST"), ("x-tenant", "acme")],
    };
    let built = envoy_descriptors(&actions["orders"], &acme);
    assert_eq!(
        built,
        pairs(&[
            &[("generic_key", "orders"), ("tenant", "acme")],
            &[("method", "POST")],
        ])
    );
    let a = ask(t.grpc, "orders", to_descriptors(&built)).await;
    assert_eq!(a.overall_code, Code::Ok as i32);
    let names: Vec<&str> = a
        .statuses
        .iter()
        .map(|s| s.current_limit.as_ref().unwrap().name.as_str())
        .collect();
    assert_eq!(names, ["acme", "writes"]);
    let read = HttpRequest {
        remote: "10.1.2.3",
        headers: &[(":method", "GET"), ("x-tenant", "other")],
    };
    let a = ask(
        t.grpc,
        "orders",
        to_descriptors(&envoy_descriptors(&actions["orders"], &read)),
    )
    .await;
    assert_eq!(
        a.statuses[0].current_limit.as_ref().unwrap().name,
        "per_tenant"
    );
    assert!(
        a.statuses[1].current_limit.is_none(),
        "reads are not limited"
    );
    t.stop().await;
}

/// The Python job spends a 100-unit-per-second budget 30 units a call: three
/// calls pass, the fourth is refused, the job waits for the reset time
/// tollgate returned and carries on; all five calls end up done.
#[tokio::test]
async fn the_python_client_spends_a_weighted_budget_and_honours_reset() {
    require_python_module("grpc", "grpcio grpcio-tools");
    require_python_module("grpc_tools", "grpcio-tools");
    let t = serve_rules("client/rules").await;
    let addr = t.grpc.to_string();
    let script = example("client/quota_job.py");
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        run_within(
            Command::new("python3")
                .args([&script, "--addr", &addr, "--calls", "5", "--cost", "30"]),
            Duration::from_secs(60),
        )
    })
    .await
    .unwrap();
    let took = started.elapsed();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    let waits: Vec<f64> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("over budget; waiting "))
        .map(|w| w.trim_end_matches('s').parse().unwrap())
        .collect();
    // A wait is printed to the millisecond: a call landing within half a
    // millisecond of the window's end prints 0.000.
    assert!(waits.iter().all(|w| *w >= 0.0 && *w <= 1.0), "{waits:?}");
    // What any pace allows, on a log of 100 a second: each call adds 30 to
    // the last second's count (entries older than a second only leave),
    // and a refusal comes only when the last second holds 10 or less.
    let mut last = 100;
    for line in &lines {
        if let Some(call) = line.strip_prefix("call ") {
            let remaining: u64 = call.rsplit(' ').next().unwrap().parse().unwrap();
            assert!(
                [70, 40, 10].contains(&remaining) && remaining + 30 >= last,
                "{line} after {last} remaining:\n{stdout}"
            );
            last = remaining;
        } else {
            assert!(
                line.starts_with("over budget; waiting ") && last < 30,
                "{line} after {last} remaining:\n{stdout}"
            );
        }
    }
    // Calls 1 to 4 come before the first wait: when the whole job, less
    // its waits, took under a second, they all fell in one second of the
    // log, and the first three spent it exactly. A busy machine can spread
    // them further; then only the rules above hold.
    let unwaited = took.saturating_sub(Duration::from_secs_f64(waits.iter().sum()));
    if unwaited < Duration::from_secs(1) {
        assert_eq!(
            &lines[..4],
            [
                "call 1: spent 30, remaining 70",
                "call 2: spent 30, remaining 40",
                "call 3: spent 30, remaining 10",
                lines[3],
            ]
        );
        assert!(lines[3].starts_with("over budget; waiting "), "{stdout}");
        assert!(waits[0] > 0.0, "{waits:?}");
    } else {
        eprintln!("the job took {unwaited:?} besides its waits: too long to expect exact counts");
    }
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("call ")).count(),
        5,
        "{stdout}"
    );
    assert!(
        took >= Duration::from_secs_f64(waits.iter().sum()),
        "it did wait"
    );
    t.stop().await;
}

/// The opt-in checksum annotation changes with the rules (so pods roll),
/// and stays put when they do not.
#[test]
fn the_rules_checksum_follows_the_rules() {
    let h = helm(3);
    let checksum = |rules: &str| {
        let (_, r) = render(
            &h,
            &[
                "--set",
                "rulesChecksumRollout=true",
                "--set-file",
                &format!("rules.r={rules}"),
            ],
        );
        r.one("Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/rules"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let edge = example("envoy/rules/edge.yaml");
    let first = checksum(&edge);
    assert_eq!(first, checksum(&edge), "same rules, same checksum");
    assert_ne!(first, checksum(&example("rules/demo.yaml")));
}
