//! `completion/complete` through the gateway: a prompt's argument is completed by the server
//! that serves the prompt, under its own name; a resource template's variable by the server
//! that listed the template. It routes by what `prompts` and `resources` know.

use rmcp::ErrorData;
use rmcp::model::{
    ClientRequest, CompleteRequest, CompleteRequestParams, CompleteResult, Reference, ServerResult,
};
use rmcp::service::{RequestContext, RoleServer};

use crate::servers::link::retype;

use super::passthrough::{forward, unknown, until};
use super::session::ClientSession;
use super::state::GatewayState;
use super::{prompts, resources};

/// `completion/complete`.
pub(crate) async fn complete(
    gw: &GatewayState,
    session: &ClientSession,
    mut params: CompleteRequestParams,
    ctx: RequestContext<RoleServer>,
) -> Result<CompleteResult, ErrorData> {
    super::call::needs_call(session, "complete arguments")?;
    params.meta = None;
    let until = until(gw, &ctx.meta);
    let server = match &mut params.r#ref {
        Reference::Prompt(prompt) => {
            let Some((server, own)) = prompts::resolve(gw, &prompt.name, until).await else {
                return Err(unknown(format!("unknown prompt {:?}", prompt.name)));
            };
            prompt.name = own;
            server
        }
        Reference::Resource(resource) => {
            let listed = gw
                .routes
                .template_server(&resource.uri)
                .and_then(|s| gw.server(&s).cloned());
            match listed {
                Some(server) => server,
                None => match resources::servers_for_uri(gw, &resource.uri, until)
                    .await
                    .into_iter()
                    .next()
                {
                    Some(server) => server,
                    None => {
                        return Err(unknown(format!("unknown resource {:?}", resource.uri)));
                    }
                },
            }
        }
        _ => return Err(unknown("unknown completion reference".into())),
    };
    let request = ClientRequest::CompleteRequest(CompleteRequest::new(params));
    match forward(session, &server, request, &ctx, until).await? {
        ServerResult::CompleteResult(r) => Ok(r),
        other => retype(other, "completion/complete"),
    }
}
