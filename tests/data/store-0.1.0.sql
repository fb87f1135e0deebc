PRAGMA foreign_keys=OFF;
BEGIN TRANSACTION;
CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at REAL);
INSERT INTO _migrations VALUES('0001_runs_receipts_logs',1796253187.8785157203);
INSERT INTO _migrations VALUES('0002_sheets_and_maps',1796253187.8786346912);
INSERT INTO _migrations VALUES('0003_boundaries_events_journal',1796253187.8787446022);
INSERT INTO _migrations VALUES('0004_rate_slots',1796253187.8787753582);
CREATE TABLE IF NOT EXISTS "runs" (
   "run_id" TEXT PRIMARY KEY,
   "play" TEXT NOT NULL,
   "play_ref" TEXT,
   "input" TEXT,
   "status" TEXT NOT NULL,
   "attempt" INTEGER NOT NULL,
   "workspace" TEXT,
   "cwd" TEXT,
   "options" TEXT,
   "parent_run_id" TEXT,
   "root_run_id" TEXT,
   "holder" TEXT,
   "lease_expires_at" REAL,
   "output" TEXT,
   "error" TEXT,
   "stats" TEXT,
   "created_at" REAL,
   "updated_at" REAL,
   "finished_at" REAL
);
INSERT INTO runs VALUES('done-run','legacy','/tmp/oldstore/play.py:legacy','{"words":["a","b"]}','completed',1,'default','/tmp/oldstore','{"concurrency":null,"limit":null,"max_credits":null,"max_inline_wait":30.0,"fail_on_row_errors":false,"config":null,"max_depth":8,"max_child_plays":null,"max_tool_calls":null}',NULL,'done-run',NULL,0.0,'{"rows":2}',NULL,'{"rows":{"succeeded":2,"failed":0,"duplicate":0,"reused":0},"tools":{"old.echo":{"live":2,"reused":0,"failed":0,"credits":2.0}},"steps":{"live":0,"reused":0},"credits":2.0,"attempts":1,"duration_s":0.011,"store_s":0.001}',1796253187.8853063583,1796253187.8969371318,1796253187.8969063758);
INSERT INTO runs VALUES('queued-run','legacy','/tmp/oldstore/play.py:legacy','{"words":["c"]}','queued',0,'default','/tmp/oldstore','{"concurrency":null,"limit":null,"max_credits":null,"max_inline_wait":30.0,"fail_on_row_errors":false,"config":null,"max_depth":8,"max_child_plays":null,"max_tool_calls":null,"snapshot":{"file":"play.py","function":"legacy","source":"from deepline_cli import play, tool\n\n\n@tool(\"old.echo\", credits=1)\ndef echo(input):\n    return {\"said\": input[\"word\"].upper() + \"!\"}\n\n\n@play(\"legacy\")\nasync def legacy(ctx, input):\n    rows = await ctx.map(\"words\", [{\"w\": w} for w in input[\"words\"]], key=\"w\",\n                         columns={\"loud\": lambda row, rc: rc.tools.execute(\"e\", \"old.echo\", {\"word\": row[\"w\"]})})\n    return {\"rows\": len(rows)}\n","config":null}}',NULL,'queued-run',NULL,0.0,NULL,NULL,'{}',1796253188.3799812793,1796253188.3799812793,NULL);
CREATE TABLE IF NOT EXISTS "receipts" (
   "key" TEXT PRIMARY KEY,
   "kind" TEXT NOT NULL,
   "label" TEXT,
   "tool" TEXT,
   "status" TEXT NOT NULL,
   "run_id" TEXT NOT NULL,
   "attempt" INTEGER NOT NULL,
   "lease_id" TEXT,
   "lease_expires_at" REAL,
   "idempotency_key" TEXT,
   "output" TEXT,
   "error" TEXT,
   "failure_kind" TEXT,
   "retryable" INTEGER,
   "credits" REAL,
   "created_at" REAL,
   "completed_at" REAL
);
INSERT INTO receipts VALUES('e8f05677f0ffbbcae98cebca8151beee','tool','e','old.echo','completed','done-run',1,'53053c950aa7d242-1',NULL,'dl-e8f05677f0ffbbcae98cebca8151beee','{"said":"A!"}',NULL,NULL,0,1.0,1796253187.8939158916,1796253187.8953487872);
INSERT INTO receipts VALUES('e24e1c18a31a6d193b0b01ce540177df','tool','e','old.echo','completed','done-run',1,'53053c950aa7d242-2',NULL,'dl-e24e1c18a31a6d193b0b01ce540177df','{"said":"B!"}',NULL,NULL,0,1.0,1796253187.8939158916,1796253187.8958976268);
CREATE TABLE run_receipts (run_id TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (run_id, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS "logs" (
   "id" INTEGER PRIMARY KEY,
   "run_id" TEXT,
   "attempt" INTEGER,
   "ts" REAL,
   "level" TEXT,
   "message" TEXT
);
INSERT INTO logs VALUES(1,'done-run',1,1796253187.8963561058,'info','Map completed: 2 results (2 succeeded, 0 failed, 0 duplicate keys skipped)');
CREATE TABLE sheet_rows (sheet TEXT NOT NULL, row_key TEXT NOT NULL, input TEXT, input_digest TEXT, cells TEXT, status TEXT, run_id TEXT, updated_at REAL, PRIMARY KEY (sheet, row_key));
INSERT INTO sheet_rows VALUES('default/legacy/words','a','{"w":"a"}','7427bd661e0b0018de775bf4f8a529e8','{"loud":[{"said":"A!"},null,1796253187.8953106,"568f65078563ee38"]}','succeeded','done-run',1796253187.8953182696);
INSERT INTO sheet_rows VALUES('default/legacy/words','b','{"w":"b"}','bcecad173ce516af69651becf551c945','{"loud":[{"said":"B!"},null,1796253187.8955188,"568f65078563ee38"]}','succeeded','done-run',1796253187.8955256939);
CREATE TABLE map_rows (run_id TEXT NOT NULL, map TEXT NOT NULL, idx INTEGER NOT NULL, input_index INTEGER, row_key TEXT, outcome TEXT, error TEXT, PRIMARY KEY (run_id, map, idx)) WITHOUT ROWID;
INSERT INTO map_rows VALUES('done-run','words',0,0,'a','succeeded',NULL);
INSERT INTO map_rows VALUES('done-run','words',1,1,'b','succeeded',NULL);
CREATE TABLE maps (run_id TEXT NOT NULL, map TEXT NOT NULL, sheet TEXT, input_columns TEXT, columns TEXT, status TEXT, total INTEGER, succeeded INTEGER, failed INTEGER, duplicate INTEGER, reused INTEGER, started_at REAL, finished_at REAL, PRIMARY KEY (run_id, map));
INSERT INTO maps VALUES('done-run','words','default/legacy/words','["w"]','["loud"]','completed',2,2,0,0,0,1796253187.8924779891,1796253187.8962421417);
CREATE TABLE boundaries (run_id TEXT NOT NULL, id TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL, due_at REAL, event_id TEXT, child_run_id TEXT, payload TEXT, created_at REAL, resolved_at REAL, PRIMARY KEY (run_id, id));
CREATE TABLE events (run_id TEXT NOT NULL, event_id TEXT NOT NULL, payload TEXT, created_at REAL, PRIMARY KEY (run_id, event_id));
CREATE TABLE journal (run_id TEXT NOT NULL, position INTEGER NOT NULL, id TEXT NOT NULL, PRIMARY KEY (run_id, position)) WITHOUT ROWID;
CREATE TABLE rate_slots (tool TEXT PRIMARY KEY, next_at REAL NOT NULL);
CREATE INDEX "idx_runs_status"
    ON "runs" ("status");
CREATE INDEX "idx_runs_root_run_id"
    ON "runs" ("root_run_id");
CREATE INDEX "idx_receipts_run_id"
    ON "receipts" ("run_id");
CREATE INDEX "idx_logs_run_id_id"
    ON "logs" ("run_id", "id");
CREATE INDEX runs_parent ON runs (parent_run_id);
COMMIT;
