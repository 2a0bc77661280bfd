// A small client of valruns written against the types openapi-typescript
// generates from docs/openapi.yaml (into generated/api.d.ts; see
// tsclient_test.go). tsc type-checks it: if the spec stops saying what the
// server does (a submission that is any JSON value, required fields, the
// run's status and findings, problem documents with a code), this no longer
// compiles. It is never run.
import type { components, paths } from "./generated/api";

type Start = paths["/api/workflows/{id}/start/"]["post"];
type StartBody = NonNullable<Start["requestBody"]>["content"]["application/json"];
type Run = components["schemas"]["handlers.Run"];
type Finding = components["schemas"]["handlers.Finding"];
// Every error is an RFC 9457 problem document with a stable code.
type Problem =
  | Start["responses"][400]["content"]["application/problem+json"]
  | Start["responses"][404]["content"]["application/problem+json"]
  | Start["responses"][409]["content"]["application/problem+json"]
  | Start["responses"][422]["content"]["application/problem+json"]
  | Start["responses"][429]["content"]["application/problem+json"]
  | Start["responses"][503]["content"]["application/problem+json"];

export class ProblemError extends Error {
  constructor(readonly problem: Problem) {
    super(`${problem.code}: ${problem.detail} (request ${problem.request_id}, ${problem.instance})`);
  }
}

function newKey(): string {
  return crypto.randomUUID();
}

// startRun starts a run with one Idempotency-Key, retried with the same key
// while the answer says to retry.
export async function startRun(base: string, token: string, workflowId: string): Promise<Run> {
  const body: StartBody = { submission: { customer: "ACME", total: 42 } };
  const key = newKey();
  for (;;) {
    const res = await fetch(`${base}/api/workflows/${encodeURIComponent(workflowId)}/start/`, {
      method: "POST",
      headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json", "Idempotency-Key": key },
      body: JSON.stringify(body),
    });
    if (res.status === 201) {
      const run: Start["responses"][201]["content"]["application/json"] = await res.json();
      return run;
    }
    const problem: Problem = await res.json();
    switch (problem.code) {
      case "idempotency_key_in_progress":
      case "rate_limited":
      case "service_unavailable":
      case "overloaded": {
        const after = Number(res.headers.get("Retry-After") ?? "1");
        await new Promise((resolve) => setTimeout(resolve, after * 1000));
        continue; // the same key: at most one run
      }
      case "quota_exceeded":
        throw new ProblemError(problem); // do not retry this month
      default:
        for (const e of problem.errors ?? []) {
          console.error(`${e.field}: ${e.message}`);
        }
        throw new ProblemError(problem);
    }
  }
}

export async function readRun(base: string, token: string, runId: string): Promise<{ status: Run["status"]; findings: Finding[] }> {
  const res = await fetch(`${base}/api/runs/${encodeURIComponent(runId)}/`, { headers: { Authorization: `Bearer ${token}` } });
  if (res.status !== 200) {
    throw new ProblemError(await res.json());
  }
  const run: paths["/api/runs/{id}/"]["get"]["responses"][200]["content"]["application/json"] = await res.json();
  const status: "queued" | "running" | "passed" | "failed" | "error" = run.status;
  const findings: Finding[] = run.findings ?? [];
  for (const f of findings) {
    const severity: "error" | "warning" | "info" = f.severity;
    console.log(`${f.step} ${severity} ${f.path}: ${f.message}`);
  }
  return { status, findings };
}

// Any JSON value is a submission.
export const submissions: StartBody[] = [
  { submission: { customer: "ACME", total: 42 } },
  { submission: "x" },
  { submission: [1, 2, 3] },
  { submission: 42 },
  { submission: null },
  { submission: true, metadata: { source: "upload" } },
];

// What the spec refuses, tsc refuses: each line below must fail to compile.
// @ts-expect-error: submission is required
export const noSubmission: StartBody = { metadata: {} };
// @ts-expect-error: a run's status is one of five
export const unknownStatus: Run["status"] = "waiting";
// @ts-expect-error: the run's id is always there
export const noID: Run["id"] = undefined;
