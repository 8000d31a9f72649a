//! The monitor's HTTP endpoints (HTTP/1.1, plain text or JSON): `/metrics` (OpenMetrics text
//! when the scraper asks for it, else the Prometheus text format),
//! `/healthz` (the process serves), `/readyz` (a verify succeeded and is recent; 503 says why
//! not), `/findings` (the current report with `since` and `pending` per finding). The only
//! socket the monitor listens on.

use crate::status::Shared;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use tokio::net::TcpListener;

/// The content type of `/metrics` for scrapers that ask for OpenMetrics (Prometheus does).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of `/metrics` otherwise: the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves the endpoints on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            a = listener.accept() => a,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, std::convert::Infallible>(respond(&shared, &req)) }
            });
            // A client that goes away mid-request is its own business.
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

const PLAIN: &str = "text/plain; charset=utf-8";

/// The answer to one request.
fn respond(shared: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "only GET and HEAD\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let wants_openmetrics = req
                .headers()
                .get_all(hyper::header::ACCEPT)
                .iter()
                .any(|v| {
                    v.to_str()
                        .is_ok_and(|v| v.contains("application/openmetrics-text"))
                });
            let body = shared.metrics_text();
            if wants_openmetrics {
                text(StatusCode::OK, OPENMETRICS, body)
            } else {
                text(
                    StatusCode::OK,
                    PROMETHEUS_TEXT,
                    crate::metrics::prometheus_text(&body),
                )
            }
        }
        "/healthz" | "/livez" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/readyz" => match shared.readiness() {
            Ok(why) => text(StatusCode::OK, PLAIN, format!("{why}\n")),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("not ready: {why}\n"),
            ),
        },
        "/findings" => match shared.findings() {
            Some(doc) => text(
                StatusCode::OK,
                "application/json",
                serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n",
            ),
            None => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "application/json",
                serde_json::json!({
                    "error": shared.readiness().err().unwrap_or_else(|| "no report yet".into())
                })
                .to_string()
                    + "\n",
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: /metrics, /healthz, /readyz, /findings\n".into(),
        ),
    }
}
