//! A stock tonic client for `grpc_server`: 15 `grpc.health.v1.Health/Check` calls in a
//! row, then one `tollgate.example.Echo/Say`; prints each status, the pushback and the
//! decoded error details.
//!
//! ```text
//! cargo run -p tollgate --example grpc_client --features grpc     # ADDR=http://127.0.0.1:50051
//! ```

use http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

#[derive(Clone, PartialEq, prost::Message)]
struct EchoRequest {
    #[prost(string, tag = "1")]
    text: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct EchoReply {
    #[prost(string, tag = "1")]
    text: String,
}

fn show(i: usize, status: &tonic::Status) {
    let pushback = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    println!(
        "{i:>2}: {:?} message={:?} grpc-retry-pushback-ms={pushback}",
        status.code(),
        status.message()
    );
    let details = status.get_error_details();
    if let Some(retry) = details.retry_info() {
        println!("    RetryInfo {{ retry_delay: {:?} }}", retry.retry_delay);
    }
    if let Some(quota) = details.quota_failure() {
        for v in &quota.violations {
            println!(
                "    QuotaFailure.violation {{ subject: {:?}, description: {:?}, quota_id: {:?}, quota_value: {} }}",
                v.subject, v.description, v.quota_id, v.quota_value
            );
        }
    }
    if let Some(info) = details.error_info() {
        println!(
            "    ErrorInfo {{ reason: {:?}, domain: {:?}, metadata: {:?} }}",
            info.reason, info.domain, info.metadata
        );
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let channel = Channel::from_shared(addr)?.connect().await?;
    let mut health = HealthClient::new(channel.clone());
    let (mut ok, mut refused) = (0, 0);
    for i in 1..=15 {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        match health.check(request).await {
            Ok(response) => {
                ok += 1;
                let fields = response
                    .metadata()
                    .get("ratelimit")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                println!(
                    "{i:>2}: OK {:?} ratelimit: {fields}",
                    response.into_inner().status()
                );
            }
            Err(status) => {
                refused += 1;
                show(i, &status);
            }
        }
    }
    println!("{ok} OK, {refused} refused");

    // A token comes back every 200 ms: wait for one, then call the other service.
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;

    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let reply: Result<tonic::Response<EchoReply>, _> = grpc
        .unary(
            tonic::Request::new(EchoRequest { text: "hi".into() }),
            PathAndQuery::from_static("/tollgate.example.Echo/Say"),
            tonic_prost::ProstCodec::default(),
        )
        .await;
    match reply {
        Ok(r) => println!("Echo/Say: {:?}", r.into_inner().text),
        Err(status) => show(16, &status),
    }
    Ok(())
}
