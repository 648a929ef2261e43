//! The standard gRPC services a node serves beside Chorus's own: health checking
//! (`grpc.health.v1.Health`) and server reflection (`grpc.reflection.v1` and
//! `grpc.reflection.v1alpha`), so that `grpcurl`, a load balancer's gRPC health check and
//! other ordinary tooling work against a node without its proto file.
//!
//! # Health names
//!
//! | name | serving while |
//! |---|---|
//! | `""` (the node) | the server runs |
//! | `chorus.v1.Chorus` | the server runs |
//! | `chorus.v1.Control` | the node hosts the control plane |
//! | `chorus.v1.Chorus/group/<id>` | group `<id>` runs here and knows a leader (leads, or follows one) |
//!
//! A group that stopped (its storage failed, or it did not start) or knows no leader is
//! `NOT_SERVING`; a group not hosted here (never, or deleted since) is unknown, which the
//! protocol answers with `NOT_FOUND`. The group names are refreshed every
//! [`REFRESH`], so a balancer that routes a group's requests checks that group's name;
//! one that only asks whether the node is up checks `""`.

use std::collections::BTreeSet;
use std::time::Duration;

use chorus_runtime::env::HostedGroup;
use chorus_runtime::Env;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// How often the group names' health is refreshed.
pub const REFRESH: Duration = Duration::from_millis(500);

/// The health-checking name of group `id`.
pub fn group_service(id: u64) -> String {
    format!("chorus.v1.Chorus/group/{id}")
}

/// The reflection services (v1 and v1alpha), naming the services this node serves:
/// Chorus's, the control plane's where it is hosted (`control`), health and reflection.
pub fn reflection(
    control: bool,
) -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let builder = |reflection: &str| {
        let mut b = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(chorus_client::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name("chorus.v1.Chorus")
            .with_service_name("grpc.health.v1.Health")
            .with_service_name(reflection);
        if control {
            b = b.with_service_name("chorus.v1.Control");
        }
        b
    };
    Ok((
        builder("grpc.reflection.v1.ServerReflection").build_v1()?,
        builder("grpc.reflection.v1alpha.ServerReflection").build_v1alpha()?,
    ))
}

/// Whether group `id` serves here: it runs and knows a leader. Blocking: an out-of-order
/// group's status is asked of its driver.
fn group_serving(env: &Env, id: u64) -> bool {
    match env.hosted(id) {
        Ok(HostedGroup::Ordered(log)) => {
            let s = log.status();
            s.stopped.is_none() && s.role.leader.is_some()
        }
        Ok(HostedGroup::OutOfOrder(h)) => {
            h.node().stopped_reason().is_none()
                && h.node()
                    .status()
                    .is_some_and(|s| s.serving || s.leader.is_some())
        }
        Err(_) => false,
    }
}

/// Keeps the health names current until the process ends: the node's and the services'
/// once, every group's every [`REFRESH`].
pub async fn run_health(env: Env, mut reporter: HealthReporter, control: bool) {
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("chorus.v1.Chorus", ServingStatus::Serving)
        .await;
    if control {
        reporter
            .set_service_status("chorus.v1.Control", ServingStatus::Serving)
            .await;
    }
    let mut known: BTreeSet<u64> = BTreeSet::new();
    loop {
        let e = env.clone();
        let now = tokio::task::spawn_blocking(move || {
            e.list_groups()
                .into_iter()
                .map(|g| {
                    let serving = g.not_started.is_none() && group_serving(&e, g.id);
                    (g.id, serving)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let ids: BTreeSet<u64> = now.iter().map(|(id, _)| *id).collect();
        for gone in known.difference(&ids) {
            reporter.clear_service_status(&group_service(*gone)).await;
        }
        for (id, serving) in now {
            let status = if serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            reporter.set_service_status(group_service(id), status).await;
        }
        known = ids;
        tokio::time::sleep(REFRESH).await;
    }
}
