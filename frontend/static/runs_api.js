// @ts-check
// The runs table's calls: the filtered, sorted page of runs (GET /api/v1/runs) and the edits
// (PATCH / DELETE /api/v1/runs/{id}). Edits need the ingest token when the server has one: the
// first 401 asks for it (askToken), it is kept in sessionStorage and sent as a bearer header.

const BASE = "/api/v1";
const TOKEN_KEY = "packscope_ingest_token";
const runPath = (runId) => `${BASE}/runs/${encodeURIComponent(runId)}`;

export async function listRuns(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "" && value !== false) search.append(key, value);
  }
  const response = await fetch(`${BASE}/runs?${search}`, { headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(`GET ${BASE}/runs answered HTTP ${response.status}`);
  return response.json();
}

async function detailOf(response) {
  try {
    const { detail } = await response.json();
    if (typeof detail === "string") return detail;
    if (Array.isArray(detail)) return detail.map((d) => `${d.loc?.slice(1).join(".")}: ${d.msg}`).join("; ");
  } catch {
    // not JSON: the status says enough
  }
  return `HTTP ${response.status}`;
}

// askToken(previousWasWrong) resolves to a token, or null when the user cancels.
export async function write(method, runId, body, askToken) {
  for (let attempt = 0; attempt < 4; attempt++) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (token) headers.Authorization = `Bearer ${token}`;
    const response = await fetch(runPath(runId), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) {
      if (token) sessionStorage.removeItem(TOKEN_KEY);
      const given = await askToken(Boolean(token));
      if (!given) throw new Error("not saved: editing runs needs the ingest token");
      sessionStorage.setItem(TOKEN_KEY, given);
      continue;
    }
    if (!response.ok) throw new Error(`${method} failed: ${await detailOf(response)}`);
    return response.status === 204 ? null : response.json();
  }
  throw new Error("the ingest token was refused");
}
