//! [`ResponseFuture`]: the store's answer, then the inner call, then the headers.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::ResponseBody;
use crate::answer::{Answer, Rendered};

/// The store's answer, boxed: store futures are opaque types.
type Waiting = Pin<Box<dyn Future<Output = Rendered> + Send>>;

pin_project! {
    /// The future of a [`RateLimitService`](super::RateLimitService) call.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        /// Waiting for the store; then the request goes to `service`.
        Waiting {
            waiting: Waiting,
            pending: Option<(S, Request<B>)>,
        },
        /// The inner service is working; its response gets the answer's fields.
        Calling {
            #[pin]
            future: S::Future,
            answer: Option<Answer>,
        },
        /// The layer answered itself.
        Answered {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S: Service<Request<B>>, B> ResponseFuture<S, B> {
    pub(crate) fn waiting(waiting: Waiting, service: S, request: Request<B>) -> Self {
        ResponseFuture {
            state: State::Waiting {
                waiting,
                pending: Some((service, request)),
            },
        }
    }

    pub(crate) fn call(future: S::Future, answer: Answer) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                answer: Some(answer),
            },
        }
    }

    pub(crate) fn refuse(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Answered {
                response: Some(response),
            },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Waiting { waiting, pending } => {
                    let step = ready!(waiting.as_mut().poll(cx));
                    let next = match (step, pending.take()) {
                        (Rendered::Pass(answer), Some((mut service, request))) => State::Calling {
                            future: service.call(request),
                            answer: Some(answer),
                        },
                        (Rendered::Refuse(response), _) => State::Answered {
                            response: Some(response),
                        },
                        // `pending` is only taken here, and the state then changes.
                        (Rendered::Pass(_), None) => State::Answered { response: None },
                    };
                    state.set(next);
                }
                StateProj::Calling { future, answer } => {
                    let mut response = ready!(future.poll(cx))?;
                    if let Some(answer) = answer.take() {
                        answer.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                }
                StateProj::Answered { response } => {
                    let response = response.take().unwrap_or_else(internal_error);
                    return Poll::Ready(Ok(response.map(ResponseBody::full)));
                }
            }
        }
    }
}

/// A bare 500, for a future polled again after it completed.
fn internal_error() -> http::Response<bytes::Bytes> {
    let mut response = http::Response::new(bytes::Bytes::new());
    *response.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
    response
}
