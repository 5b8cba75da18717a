// The audit history: its own section of the page, shown only when the server keeps an audit
// trail (`GET /v1/audit` answers). Until then the section stays hidden and nothing else on the
// page depends on it.
//
// The API it will read:
//   GET /v1/audit?session=&turn=&call=&tool=&status=&type=&since=&after=&limit=
//       → {"events": [<events as /v1/events sends them>], "next": seq | null}
//   GET /v1/audit/calls?<the same filters>&cursor=
//       → {"calls": [{call_id, turn_id, session_id, tool, status, started_at, ended_at,
//                     duration_ms, attempts, events: [...]}], "next": cursor | null}
// The view to build on it: a search by session, turn, tool and status, and each call's
// timeline (start, progress, retries, timeout, stop) on one line — view.js's timelineText
// already writes such a line for live calls.

/** Probes the audit API; reveals `section` only if the server has one. */
export async function mountAudit({ api, section }) {
  if (!section) return false;
  try {
    await api.get("/v1/audit?limit=1");
  } catch {
    // 404: this server has no audit trail (yet). Anything else: try again on the next load.
    section.hidden = true;
    return false;
  }
  // The server keeps an audit trail, but this page does not show it yet: keep the section
  // hidden rather than show an empty one.
  section.hidden = true;
  return true;
}
