package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is everything one run measured.
type Report struct {
	Quick    bool      `json:"quick"`
	Only     string    `json:"only,omitempty"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Machine  Machine   `json:"machine"`

	Stream          []StreamCase      `json:"stream,omitempty"`
	Producer        *ProducerCost     `json:"producer_cost,omitempty"`
	CorrelatorAlone []CorrelatorCase  `json:"correlator_alone,omitempty"`
	Sinks           *SinkCase         `json:"sinks,omitempty"`
	SinkLatency     []SinkLatencyCase `json:"sink_latency,omitempty"`
	SinkFloor       []SinkFloorCase   `json:"sink_floor,omitempty"`
	Latency         []LatencyCase     `json:"latency,omitempty"`
	Steps           *StepsResult      `json:"steps,omitempty"`
	Declared        *DeclaredResult   `json:"declared,omitempty"`
	Capacity        *CapacityResult   `json:"capacity,omitempty"`
	Overload        *LatencyCase      `json:"overload,omitempty"`
	Claim           []ClaimCase       `json:"claim,omitempty"`
	ClaimTenants    []ClaimCase       `json:"claim_tenants,omitempty"`
	Curve           []CurvePoint      `json:"curve,omitempty"`
	Soak            *SoakResult       `json:"soak,omitempty"`

	LoadAverage []ScenarioLoad `json:"load_average"`
	Notes       []string       `json:"notes,omitempty"`
	Errors      []string       `json:"errors,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs        int     `json:"cpus"`
	CPUModel    string  `json:"cpu_model"`
	MemoryMB    int64   `json:"memory_mb"`
	OS          string  `json:"os"`
	Kernel      string  `json:"kernel"`
	GoVersion   string  `json:"go_version"`
	PostgreSQL  string  `json:"postgresql"`
	Server      string  `json:"server"`
	Durable     bool    `json:"durable"`
	LoadAtStart float64 `json:"load_at_start"`
	LoadAtEnd   float64 `json:"load_at_end"`
}

// ScenarioLoad is the 1-minute load average around one scenario.
type ScenarioLoad struct {
	Scenario string  `json:"scenario"`
	Before   float64 `json:"before"`
	After    float64 `json:"after"`
}

// StreamCase is scenario 1 for one source transaction size: the same WAL
// read by pg_recvlogical, by the relay's stream with checkpoint commits only,
// and by the stream with the correlator starting one saga per event.
type StreamCase struct {
	// Source is how the events were written: SourceRows (outbox rows; also
	// when empty, in reports from before the messages variant) or
	// SourceMessages (transactional logical decoding messages).
	Source            string  `json:"source,omitempty"`
	RowsPerTx         int     `json:"rows_per_tx"`
	Events            int     `json:"events"`
	RecvlogicalPerSec float64 `json:"recvlogical_events_per_sec"`
	StreamPerSec      float64 `json:"stream_events_per_sec"`
	StreamBatches     int     `json:"stream_batches"`
	CorrelatePerSec   float64 `json:"correlate_events_per_sec"`
	CorrelateBatches  int     `json:"correlate_batches"`
	StreamRatio       float64 `json:"stream_ratio"`
	CorrelateRatio    float64 `json:"correlate_ratio"`
	// CorrelateLimitPerSec is the correlator's floor in the same pass: the
	// time pg_recvlogical took to decode the WAL plus a COPY of the rows
	// the correlator wrote into a table with saga_instances' columns and
	// indexes. CorrelateLimitRatio is the correlator's rate over it.
	CorrelateLimitPerSec float64 `json:"correlate_limit_events_per_sec"`
	CorrelateLimitRatio  float64 `json:"correlate_limit_ratio"`
	// The spread of each ratio's passes: (max − min) / median.
	StreamRatioSpread         *float64 `json:"stream_ratio_spread"`
	CorrelateRatioSpread      *float64 `json:"correlate_ratio_spread"`
	CorrelateLimitRatioSpread *float64 `json:"correlate_limit_ratio_spread"`
	// LoadAverages is the 1-minute load average before each pass.
	LoadAverages []float64 `json:"load_averages"`
	// StreamSinkBusy and CorrelateSinkBusy are the share of the wall time
	// spent inside the sink (the correlator's transactions): near 1, the
	// sink is what limits the stream.
	StreamSinkBusy    float64 `json:"stream_sink_busy"`
	CorrelateSinkBusy float64 `json:"correlate_sink_busy"`
	// The runs behind the medians above, events per second, in order.
	RecvlogicalRuns []float64 `json:"recvlogical_runs"`
	StreamRuns      []float64 `json:"stream_runs"`
	CorrelateRuns   []float64 `json:"correlate_runs"`
	LimitRuns       []float64 `json:"correlate_limit_runs"`
}

// ProducerCost is what one event costs its producer as an outbox row and as
// a transactional logical decoding message (see producerCost): the mean
// client time per one-event transaction in µs and the WAL bytes per event
// (medians over the runs), the row's later DELETE and VACUUM, and the
// message's figures over the row's.
type ProducerCost struct {
	Events              int     `json:"events"`
	RowTxMicros         float64 `json:"row_tx_us"`
	MessageTxMicros     float64 `json:"message_tx_us"`
	RowWALBytes         float64 `json:"row_wal_bytes"`
	MessageWALBytes     float64 `json:"message_wal_bytes"`
	RowCleanupWALBytes  float64 `json:"row_cleanup_wal_bytes"`
	RowCleanupMicros    float64 `json:"row_cleanup_us"`
	TxRatio             float64 `json:"tx_ratio"`
	WALRatio            float64 `json:"wal_ratio"`
	WALRatioWithCleanup float64 `json:"wal_ratio_with_cleanup"`
}

// CorrelatorCase is the correlator alone, fed synthetic batches of one size
// (no stream): its ceiling per batch size.
type CorrelatorCase struct {
	BatchEvents   int     `json:"batch_events"`
	Batches       int     `json:"batches"`
	EventsPerSec  float64 `json:"events_per_sec"`
	BatchesPerSec float64 `json:"batches_per_sec"`
}

// LatencyCase is scenario 2 at one rate.
type LatencyCase struct {
	Rate         int            `json:"rate"`
	Seconds      float64        `json:"seconds"`
	Produced     int            `json:"produced"`
	AchievedRate float64        `json:"achieved_rate"`
	Start        LatencySummary `json:"start"`
	FirstStep    LatencySummary `json:"first_step"`
	// End is the trigger's commit to the saga's COMPLETED commit.
	End LatencySummary `json:"end"`
	// Events still without a saga start, a first step or an end when the
	// bounded wait ended: they count with the time waited, so the
	// percentiles are lower bounds when these are not zero.
	StartUnfinished     int `json:"start_unfinished"`
	FirstStepUnfinished int `json:"first_step_unfinished"`
	EndUnfinished       int `json:"end_unfinished"`
	// StepsPerSec is the steps committed per second from the producer's
	// start until every saga ended (or the wait gave up).
	StepsPerSec float64 `json:"steps_per_sec"`
	// Overload marks the overload case: the rate is twice the saga rate
	// the capacity scenario found sustainable.
	Overload bool `json:"overload,omitempty"`
}

// CapacityResult is the capacity scenario: the sustainable saga rate of the
// whole relay on this machine, the ramp that found it, and the latency at
// shares of it (the overload case is Report.Overload).
type CapacityResult struct {
	SagasPerSec float64         `json:"sagas_per_sec"`
	Ramp        []RampStep      `json:"ramp"`
	Levels      []CapacityLevel `json:"levels,omitempty"`
}

// RampStep is one rate the capacity ramp held, measured over the window
// after its settling time.
type RampStep struct {
	Rate            int     `json:"rate"`
	Seconds         float64 `json:"seconds"`
	ProducedPerSec  float64 `json:"produced_per_sec"`
	CompletedPerSec float64 `json:"completed_per_sec"`
	Sustained       bool    `json:"sustained"`
}

// CapacityLevel is the latency at a share (percent) of the sustainable rate.
type CapacityLevel struct {
	Percent int `json:"percent"`
	LatencyCase
}

// ClaimCase is the claim scenario at one backlog size.
type ClaimCase struct {
	Due int `json:"due"`
	// Tenants is how many tenants the due instances belong to (1: the
	// oldest-first claim alone; more: the claim shared between them).
	Tenants int `json:"tenants,omitempty"`
	// ClaimMs is the median time of one claim of 8 instances; StartMs of
	// the correlator's transaction starting 1,000 sagas.
	ClaimMs float64 `json:"claim_ms"`
	StartMs float64 `json:"start_ms"`
}

// StatementCost is one pg_stat_statements row of the step runs.
type StatementCost struct {
	Query           string  `json:"query"`
	Calls           int64   `json:"calls"`
	TotalMs         float64 `json:"total_ms"`
	MeanMs          float64 `json:"mean_ms"`
	PerStepMs       float64 `json:"ms_per_step"`
	WALBytesPerCall float64 `json:"wal_bytes_per_call"`
}

// StepsResult is scenario 3.
type StepsResult struct {
	Sagas          int     `json:"sagas"`
	StepsPerSaga   int     `json:"steps_per_saga"`
	Workers        int     `json:"workers"`
	Seconds        float64 `json:"seconds"`
	StepsPerSec    float64 `json:"steps_per_sec"`
	PgbenchTPS     float64 `json:"pgbench_step_tps"`
	PgbenchClients int     `json:"pgbench_clients"`
	PgbenchSeconds float64 `json:"pgbench_seconds"`
	Ratio          float64 `json:"step_ratio"`
	// RatioSpread is the spread of the passes' step ratios, and
	// LoadAverages the 1-minute load average before each pass.
	RatioSpread  *float64  `json:"step_ratio_spread"`
	LoadAverages []float64 `json:"load_averages"`
	// Claims is how many claim queries returned instances, PerClaim the
	// instances each leased on average and ClaimSeconds the time spent in
	// them (the dispatcher runs them one at a time).
	Claims       int     `json:"claims"`
	PerClaim     float64 `json:"instances_per_claim"`
	ClaimSeconds float64 `json:"claim_seconds"`
	// HotShare is the share of saga_instances updates during the runs
	// that were HOT (no new index entries; pg_stat_user_tables).
	HotShare float64 `json:"hot_update_share"`
	// ServerMsPerStep is the server's time in every statement of a run
	// (pg_stat_statements' total_exec_time) over its steps, and
	// PgbenchServerMsPerTx the same for pgbench's run over its
	// transactions (medians of the runs; null without pg_stat_statements).
	ServerMsPerStep      *float64 `json:"server_ms_per_step"`
	PgbenchServerMsPerTx *float64 `json:"pgbench_server_ms_per_tx"`
	// Statements are the server's costliest statements during the last
	// slice of the last run (pg_stat_statements, when the server has it).
	Statements []StatementCost `json:"statements,omitempty"`
	// PgbenchStatements: the same for pgbench's slice (per transaction).
	PgbenchStatements []StatementCost `json:"pgbench_statements,omitempty"`
	// The runs behind the medians above.
	StepsRuns   []float64 `json:"steps_runs,omitempty"`
	PgbenchRuns []float64 `json:"pgbench_runs,omitempty"`
	// Peers: steps/s of the same workload on DBOS Transact and River
	// (default and 1 ms fetch cooldown), run by bench/peers between the
	// runner's runs (medians; nil when not run).
	PeerDBOS      *float64 `json:"peer_dbos_steps_per_sec,omitempty"`
	PeerRiver     *float64 `json:"peer_river_steps_per_sec,omitempty"`
	PeerRiverFast *float64 `json:"peer_river_fast_steps_per_sec,omitempty"`
	PeerRuns      []string `json:"peer_runs,omitempty"`
}

// CurvePoint is one size of scenario 5 (and the source of scenario 4).
type CurvePoint struct {
	Events       int     `json:"events"`
	RowsPerTx    int     `json:"rows_per_tx"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	Batches      int     `json:"batches"`
	PeakRSSMB    float64 `json:"peak_rss_mb"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	CPUPer100k   float64 `json:"cpu_seconds_per_100k_events"`
	// InProcess: measured inside the bench process (harness included)
	// rather than in a child relay.
	InProcess bool `json:"in_process"`
}

// SoakResult is the soak scenarios: the rate they held and one run each.
type SoakResult struct {
	// CapacitySagasPerSec is the sustainable rate the offered rate is a
	// share of (soakShare %), from the capacity ramp (Ramp) or the capacity
	// scenario; RateGiven: Config.SoakRate set the rate instead.
	CapacitySagasPerSec float64    `json:"capacity_sagas_per_sec,omitempty"`
	RateGiven           bool       `json:"rate_given,omitempty"`
	Ramp                []RampStep `json:"ramp,omitempty"`
	Runs                []SoakRun  `json:"runs"`
	// Plot is where the plot was written.
	Plot string `json:"plot,omitempty"`
}

// SoakRun is one soak run (with or without retention).
type SoakRun struct {
	Name      string `json:"name"`
	Retention bool   `json:"retention"`
	Sagas     int    `json:"sagas"`
	// Rate is the offered rate (sagas/s), AchievedRate what the producer
	// committed over Seconds.
	Rate         int     `json:"rate"`
	AchievedRate float64 `json:"achieved_rate"`
	Seconds      float64 `json:"seconds"`
	// The retention held (0: none), and the `relay run` flags it stands for.
	SagaRetentionSec   float64 `json:"saga_retention_s"`
	OutboxRetentionSec float64 `json:"outbox_retention_s"`
	DedupeWindowSec    float64 `json:"dedupe_window_s"`
	Command            string  `json:"command"`
	// TenthSagasPerSec: sagas COMPLETED per second in each tenth of the
	// producer's time; ThroughputRatio the last tenth's over the first's.
	TenthSagasPerSec []float64 `json:"tenth_sagas_per_sec"`
	ThroughputRatio  *float64  `json:"throughput_ratio"`
	// TenthEndP99Ms: p99 of trigger commit → COMPLETED of each tenth of
	// the triggers (by sequence); End over all of them.
	TenthEndP99Ms []*float64     `json:"tenth_end_p99_ms"`
	End           LatencySummary `json:"end"`
	EndUnfinished int            `json:"end_unfinished"`
	// The relay's tables' bytes ReferenceSec (one retention) after the
	// producer started and at the end, and the end's over the former.
	ReferenceSec          float64  `json:"reference_s"`
	TableBytesAtReference int64    `json:"table_bytes_at_reference"`
	TableBytesEnd         int64    `json:"table_bytes_end"`
	TableBytesGrowth      *float64 `json:"table_bytes_growth"`
	// TableBytesGrowthFromTenth is the end's bytes over those at the end of
	// the first tenth of the producer's time: with retention, what grows
	// once the janitor and autovacuum have reached their steady state.
	TableBytesGrowthFromTenth *float64 `json:"table_bytes_growth_from_tenth"`
	// TableBytesEndByTable: each table's bytes at the end.
	TableBytesEndByTable map[string]int64 `json:"table_bytes_end_by_table"`
	// RSSMBMax is the bench process's (the relay's, with the producer and
	// the timeline) resident high-water mark during the run; CPUSeconds its
	// CPU time.
	RSSMBMax   float64 `json:"rss_mb_max"`
	CPUSeconds float64 `json:"cpu_seconds"`
	LoadBefore float64 `json:"load_before"`
	LoadAfter  float64 `json:"load_after"`
	LoadMax    float64 `json:"load_max"`
	// Samples are taken every few seconds; Buckets are the plot's lines.
	Samples []SoakSample `json:"samples"`
	Buckets []SoakBucket `json:"buckets"`
}

// SoakSample is one sample of a soak run, T seconds after the producer
// started.
type SoakSample struct {
	T          float64 `json:"t"`
	Completed  int64   `json:"completed"`
	TableBytes int64   `json:"table_bytes"`
	RSSMB      float64 `json:"rss_mb"`
	Load       float64 `json:"load"`
	// Estimates from pg_stat_user_tables over the same tables: live rows of
	// saga_instances and of all, dead rows, autovacuum runs so far.
	InstanceRows int64 `json:"instance_rows"`
	LiveRows     int64 `json:"live_rows"`
	DeadRows     int64 `json:"dead_rows"`
	Autovacuums  int64 `json:"autovacuums"`
}

// SoakBucket is one window of the producer's time: the sagas completed in
// it per second, and the p99 end latency of the triggers committed in it.
type SoakBucket struct {
	T           float64  `json:"t"`
	SagasPerSec float64  `json:"sagas_per_sec"`
	EndP99Ms    *float64 `json:"end_p99_ms"`
}

// Summary is the one-line JSON object `relay-bench --json` prints last. A
// figure that was not measured (--only, a failed scenario) is null.
type Summary struct {
	RecvlogicalEventsPerSec  *float64 `json:"recvlogical_events_per_sec"`
	StreamEventsPerSec       *float64 `json:"stream_events_per_sec"`
	StreamRatio              *float64 `json:"stream_ratio"`
	CorrelateEventsPerSec    *float64 `json:"correlate_events_per_sec"`
	CorrelateRatio           *float64 `json:"correlate_ratio"`
	StreamRatioSpread        *float64 `json:"stream_ratio_spread"`
	CorrelateRatioSpread     *float64 `json:"correlate_ratio_spread"`
	CorrelateLimitRatio      *float64 `json:"correlate_limit_ratio"`
	CorrelateLimitSpread     *float64 `json:"correlate_limit_ratio_spread"`
	StartP99Ms               *float64 `json:"start_p99_ms"`
	FirstStepP99Ms           *float64 `json:"first_step_p99_ms"`
	StepsPerSec              *float64 `json:"steps_per_sec"`
	PgbenchStepTPS           *float64 `json:"pgbench_step_tps"`
	StepRatio                *float64 `json:"step_ratio"`
	StepRatioSpread          *float64 `json:"step_ratio_spread"`
	ServerMsPerStep          *float64 `json:"server_ms_per_step"`
	DeclaredStepRatio        *float64 `json:"declared_step_ratio"`
	NATSSinkEventsPerSec     *float64 `json:"nats_sink_events_per_sec"`
	NATSSinkRatio            *float64 `json:"nats_sink_ratio"`
	NATSSinkRatioSpread      *float64 `json:"nats_sink_ratio_spread"`
	WebhookSinkEventsPerSec  *float64 `json:"webhook_sink_events_per_sec"`
	WebhookSinkRatio         *float64 `json:"webhook_sink_ratio"`
	WebhookSinkRatioSpread   *float64 `json:"webhook_sink_ratio_spread"`
	RabbitMQSinkEventsPerSec *float64 `json:"rabbitmq_sink_events_per_sec"`
	RabbitMQSinkRatio        *float64 `json:"rabbitmq_sink_ratio"`
	RedisSinkEventsPerSec    *float64 `json:"redis_sink_events_per_sec"`
	RedisSinkRatio           *float64 `json:"redis_sink_ratio"`
	// Producer commit → sink acknowledgement at 1,000 and 5,000 events/s.
	// The floor: created_at → receipt by a bare replication reader at the
	// same rates (see floorLatency).
	SinkFloorLatencyP50Ms1k    *float64 `json:"sink_floor_latency_p50_ms_1k"`
	SinkFloorLatencyP99Ms1k    *float64 `json:"sink_floor_latency_p99_ms_1k"`
	SinkFloorLatencyP50Ms5k    *float64 `json:"sink_floor_latency_p50_ms_5k"`
	SinkFloorLatencyP99Ms5k    *float64 `json:"sink_floor_latency_p99_ms_5k"`
	NATSSinkLatencyP50Ms1k     *float64 `json:"nats_sink_latency_p50_ms_1k"`
	NATSSinkLatencyP99Ms1k     *float64 `json:"nats_sink_latency_p99_ms_1k"`
	NATSSinkLatencyP50Ms5k     *float64 `json:"nats_sink_latency_p50_ms_5k"`
	NATSSinkLatencyP99Ms5k     *float64 `json:"nats_sink_latency_p99_ms_5k"`
	WebhookSinkLatencyP50Ms5k  *float64 `json:"webhook_sink_latency_p50_ms_5k"`
	WebhookSinkLatencyP99Ms5k  *float64 `json:"webhook_sink_latency_p99_ms_5k"`
	KafkaSinkLatencyP50Ms5k    *float64 `json:"kafka_sink_latency_p50_ms_5k"`
	KafkaSinkLatencyP99Ms5k    *float64 `json:"kafka_sink_latency_p99_ms_5k"`
	RabbitMQSinkLatencyP50Ms5k *float64 `json:"rabbitmq_sink_latency_p50_ms_5k"`
	RabbitMQSinkLatencyP99Ms5k *float64 `json:"rabbitmq_sink_latency_p99_ms_5k"`
	RedisSinkLatencyP50Ms5k    *float64 `json:"redis_sink_latency_p50_ms_5k"`
	RedisSinkLatencyP99Ms5k    *float64 `json:"redis_sink_latency_p99_ms_5k"`
	PeakRSSMB                  *float64 `json:"peak_rss_mb"`
	// The saga's end at the first rate (trigger commit → COMPLETED).
	EndP99Ms *float64 `json:"end_p99_ms"`
	// Steps/s while a backlog exists and drains (producer at twice the
	// sustainable saga rate) over the sustainable steps/s (three per saga
	// of capacity_sagas_per_sec).
	OverloadStepsRatio *float64 `json:"overload_steps_ratio"`
	// The whole relay's sustainable saga rate, and the latency at 25, 50
	// and 75 % of it (trigger commit → saga start, first step, COMPLETED).
	CapacitySagasPerSec   *float64 `json:"capacity_sagas_per_sec"`
	Curve25StartP50Ms     *float64 `json:"curve_25_start_p50_ms"`
	Curve25StartP99Ms     *float64 `json:"curve_25_start_p99_ms"`
	Curve25FirstStepP50Ms *float64 `json:"curve_25_first_step_p50_ms"`
	Curve25FirstStepP99Ms *float64 `json:"curve_25_first_step_p99_ms"`
	Curve25EndP50Ms       *float64 `json:"curve_25_end_p50_ms"`
	Curve25EndP99Ms       *float64 `json:"curve_25_end_p99_ms"`
	Curve50StartP50Ms     *float64 `json:"curve_50_start_p50_ms"`
	Curve50StartP99Ms     *float64 `json:"curve_50_start_p99_ms"`
	Curve50FirstStepP50Ms *float64 `json:"curve_50_first_step_p50_ms"`
	Curve50FirstStepP99Ms *float64 `json:"curve_50_first_step_p99_ms"`
	Curve50EndP50Ms       *float64 `json:"curve_50_end_p50_ms"`
	Curve50EndP99Ms       *float64 `json:"curve_50_end_p99_ms"`
	Curve75StartP50Ms     *float64 `json:"curve_75_start_p50_ms"`
	Curve75StartP99Ms     *float64 `json:"curve_75_start_p99_ms"`
	Curve75FirstStepP50Ms *float64 `json:"curve_75_first_step_p50_ms"`
	Curve75FirstStepP99Ms *float64 `json:"curve_75_first_step_p99_ms"`
	Curve75EndP50Ms       *float64 `json:"curve_75_end_p50_ms"`
	Curve75EndP99Ms       *float64 `json:"curve_75_end_p99_ms"`
	// Median claim of 8 with 1,000 and 1,000,000 due instances.
	ClaimMs1k *float64 `json:"claim_ms_1k"`
	ClaimMs1m *float64 `json:"claim_ms_1m"`
	// The claim shared between 1,000 tenants, at the same backlogs.
	ClaimTenantsMs1k *float64 `json:"claim_tenants_ms_1k"`
	ClaimTenantsMs1m *float64 `json:"claim_tenants_ms_1m"`
	// The peers' steps/s in the same run (bench/peers, --peers).
	PeerDBOSStepsPerSec  *float64 `json:"peer_dbos_steps_per_sec"`
	PeerRiverStepsPerSec *float64 `json:"peer_river_steps_per_sec"`

	// The 100-rows-per-transaction stream case.
	Tx100RecvlogicalEventsPerSec *float64 `json:"tx100_recvlogical_events_per_sec"`
	Tx100StreamRatio             *float64 `json:"tx100_stream_ratio"`
	Tx100CorrelateRatio          *float64 `json:"tx100_correlate_ratio"`
	Tx100StreamRatioSpread       *float64 `json:"tx100_stream_ratio_spread"`
	Tx100CorrelateRatioSpread    *float64 `json:"tx100_correlate_ratio_spread"`
	Tx100CorrelateLimitRatio     *float64 `json:"tx100_correlate_limit_ratio"`
	Tx100CorrelateLimitSpread    *float64 `json:"tx100_correlate_limit_ratio_spread"`
	// Latency at the higher rate.
	HighRate           *int     `json:"high_rate"`
	HighStartP99Ms     *float64 `json:"high_rate_start_p99_ms"`
	HighFirstStepP99Ms *float64 `json:"high_rate_first_step_p99_ms"`
	// Events without a first step when the bounded wait ended (the p99
	// above is then a lower bound).
	FirstStepUnfinished     *int      `json:"first_step_unfinished"`
	HighFirstStepUnfinished *int      `json:"high_rate_first_step_unfinished"`
	CPUSecondsPer100k       *float64  `json:"cpu_seconds_per_100k_events"`
	PeakRSSEvents           *int      `json:"peak_rss_events"`
	ResourcesInProcess      *bool     `json:"resources_in_process"`
	CurveEventsPerSec       []float64 `json:"curve_events_per_sec,omitempty"`
	// The soak with retention (soak_) and without (soak_noret_): sagas
	// run, the offered rate, sagas/s completed in the last tenth over the
	// first, the tables' bytes at the end over one retention after the
	// start, p99 end latency per tenth, the process's RSS high-water mark.
	SoakCapacitySagasPerSec   *float64   `json:"soak_capacity_sagas_per_sec"`
	SoakSagas                 *int       `json:"soak_sagas"`
	SoakRate                  *int       `json:"soak_rate"`
	SoakThroughputRatio       *float64   `json:"soak_throughput_ratio"`
	SoakTableBytesGrowth      *float64   `json:"soak_table_bytes_growth"`
	SoakTableGrowthFromTenth  *float64   `json:"soak_table_bytes_growth_from_tenth"`
	SoakTableMBEnd            *float64   `json:"soak_table_mb_end"`
	SoakEndP99Ms              []*float64 `json:"soak_end_p99_ms"`
	SoakRSSMBMax              *float64   `json:"soak_rss_mb_max"`
	SoakLoadMax               *float64   `json:"soak_load_max"`
	SoakNoretSagas            *int       `json:"soak_noret_sagas"`
	SoakNoretRate             *int       `json:"soak_noret_rate"`
	SoakNoretThroughputRatio  *float64   `json:"soak_noret_throughput_ratio"`
	SoakNoretTableBytesGrowth *float64   `json:"soak_noret_table_bytes_growth"`
	SoakNoretGrowthFromTenth  *float64   `json:"soak_noret_table_bytes_growth_from_tenth"`
	SoakNoretTableMBEnd       *float64   `json:"soak_noret_table_mb_end"`
	SoakNoretEndP99Ms         []*float64 `json:"soak_noret_end_p99_ms"`
	SoakNoretRSSMBMax         *float64   `json:"soak_noret_rss_mb_max"`
	SoakNoretLoadMax          *float64   `json:"soak_noret_load_max"`
	Quick                     bool       `json:"quick"`
	LoadAverageStart          float64    `json:"load_average_start"`
	LoadAverageEnd            float64    `json:"load_average_end"`
	Errors                    []string   `json:"errors,omitempty"`
}

func f64(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	r := math.Round(v*1000) / 1000
	return &r
}

// Summary condenses the report into the headline figures.
func (r *Report) Summary() Summary {
	s := Summary{Quick: r.Quick, LoadAverageStart: r.Machine.LoadAtStart, LoadAverageEnd: r.Machine.LoadAtEnd, Errors: r.Errors}
	if c := r.Sinks; c != nil {
		s.NATSSinkEventsPerSec, s.NATSSinkRatio = f64(c.NATSPerSec), f64(c.NATSRatio)
		s.WebhookSinkEventsPerSec, s.WebhookSinkRatio = f64(c.WebhookPerSec), f64(c.WebhookRatio)
		s.NATSSinkRatioSpread, s.WebhookSinkRatioSpread = c.NATSRatioSpread, c.WebhookRatioSpread
		s.RabbitMQSinkEventsPerSec, s.RabbitMQSinkRatio = f64(c.RabbitMQPerSec), f64(c.RabbitMQRatio)
		s.RedisSinkEventsPerSec, s.RedisSinkRatio = f64(c.RedisPerSec), f64(c.RedisRatio)
	}
	for _, f := range r.SinkFloor {
		switch f.Rate {
		case 1000:
			s.SinkFloorLatencyP50Ms1k, s.SinkFloorLatencyP99Ms1k = f64(f.Latency.P50), f64(f.Latency.P99)
		case 5000:
			s.SinkFloorLatencyP50Ms5k, s.SinkFloorLatencyP99Ms5k = f64(f.Latency.P50), f64(f.Latency.P99)
		}
	}
	for _, c := range r.SinkLatency {
		p50, p99 := f64(c.Latency.P50), f64(c.Latency.P99)
		switch {
		case c.Sink == "nats" && c.Rate == 1000:
			s.NATSSinkLatencyP50Ms1k, s.NATSSinkLatencyP99Ms1k = p50, p99
		case c.Sink == "nats" && c.Rate == 5000:
			s.NATSSinkLatencyP50Ms5k, s.NATSSinkLatencyP99Ms5k = p50, p99
		case c.Sink == "webhook" && c.Rate == 5000:
			s.WebhookSinkLatencyP50Ms5k, s.WebhookSinkLatencyP99Ms5k = p50, p99
		case c.Sink == "kafka" && c.Rate == 5000:
			s.KafkaSinkLatencyP50Ms5k, s.KafkaSinkLatencyP99Ms5k = p50, p99
		case c.Sink == "rabbitmq" && c.Rate == 5000:
			s.RabbitMQSinkLatencyP50Ms5k, s.RabbitMQSinkLatencyP99Ms5k = p50, p99
		case c.Sink == "redis" && c.Rate == 5000:
			s.RedisSinkLatencyP50Ms5k, s.RedisSinkLatencyP99Ms5k = p50, p99
		}
	}
	for _, c := range r.Stream {
		if c.Source == SourceMessages {
			continue // the headline figures are the outbox table's
		}
		switch c.RowsPerTx {
		case 1:
			s.RecvlogicalEventsPerSec = f64(c.RecvlogicalPerSec)
			s.StreamEventsPerSec = f64(c.StreamPerSec)
			s.StreamRatio = f64(c.StreamRatio)
			s.CorrelateEventsPerSec = f64(c.CorrelatePerSec)
			s.CorrelateRatio = f64(c.CorrelateRatio)
			s.StreamRatioSpread, s.CorrelateRatioSpread = c.StreamRatioSpread, c.CorrelateRatioSpread
			s.CorrelateLimitRatio, s.CorrelateLimitSpread = f64(c.CorrelateLimitRatio), c.CorrelateLimitRatioSpread
		case 100:
			s.Tx100RecvlogicalEventsPerSec = f64(c.RecvlogicalPerSec)
			s.Tx100StreamRatio = f64(c.StreamRatio)
			s.Tx100CorrelateRatio = f64(c.CorrelateRatio)
			s.Tx100StreamRatioSpread, s.Tx100CorrelateRatioSpread = c.StreamRatioSpread, c.CorrelateRatioSpread
			s.Tx100CorrelateLimitRatio, s.Tx100CorrelateLimitSpread = f64(c.CorrelateLimitRatio), c.CorrelateLimitRatioSpread
		}
	}
	for i, c := range r.Latency {
		unfinished := c.FirstStepUnfinished
		if i == 0 {
			s.StartP99Ms = f64(c.Start.P99)
			s.FirstStepP99Ms = f64(c.FirstStep.P99)
			s.EndP99Ms = f64(c.End.P99)
			s.FirstStepUnfinished = &unfinished
		} else {
			rate := c.Rate
			s.HighRate = &rate
			s.HighStartP99Ms = f64(c.Start.P99)
			s.HighFirstStepP99Ms = f64(c.FirstStep.P99)
			s.HighFirstStepUnfinished = &unfinished
		}
	}
	if d := r.Declared; d != nil {
		s.DeclaredStepRatio = f64(d.Ratio)
	}
	if st := r.Steps; st != nil {
		s.StepsPerSec = f64(st.StepsPerSec)
		s.PgbenchStepTPS = f64(st.PgbenchTPS)
		s.StepRatio = f64(st.Ratio)
		s.StepRatioSpread = st.RatioSpread
		s.ServerMsPerStep = st.ServerMsPerStep
		s.PeerDBOSStepsPerSec, s.PeerRiverStepsPerSec = st.PeerDBOS, st.PeerRiver
	}
	if c := r.Capacity; c != nil && c.SagasPerSec > 0 {
		s.CapacitySagasPerSec = f64(c.SagasPerSec)
		if o := r.Overload; o != nil {
			s.OverloadStepsRatio = f64(o.StepsPerSec / (c.SagasPerSec * benchStepsPerSaga))
		}
		for _, l := range c.Levels {
			var p [6]**float64
			switch l.Percent {
			case 25:
				p = [6]**float64{&s.Curve25StartP50Ms, &s.Curve25StartP99Ms, &s.Curve25FirstStepP50Ms, &s.Curve25FirstStepP99Ms, &s.Curve25EndP50Ms, &s.Curve25EndP99Ms}
			case 50:
				p = [6]**float64{&s.Curve50StartP50Ms, &s.Curve50StartP99Ms, &s.Curve50FirstStepP50Ms, &s.Curve50FirstStepP99Ms, &s.Curve50EndP50Ms, &s.Curve50EndP99Ms}
			case 75:
				p = [6]**float64{&s.Curve75StartP50Ms, &s.Curve75StartP99Ms, &s.Curve75FirstStepP50Ms, &s.Curve75FirstStepP99Ms, &s.Curve75EndP50Ms, &s.Curve75EndP99Ms}
			default:
				continue
			}
			for i, v := range []float64{l.Start.P50, l.Start.P99, l.FirstStep.P50, l.FirstStep.P99, l.End.P50, l.End.P99} {
				*p[i] = f64(v)
			}
		}
	}
	for _, c := range r.Claim {
		switch c.Due {
		case 1000:
			s.ClaimMs1k = f64(c.ClaimMs)
		case 1000000:
			s.ClaimMs1m = f64(c.ClaimMs)
		}
	}
	for _, c := range r.ClaimTenants {
		switch c.Due {
		case 1000:
			s.ClaimTenantsMs1k = f64(c.ClaimMs)
		case 1000000:
			s.ClaimTenantsMs1m = f64(c.ClaimMs)
		}
	}
	if n := len(r.Curve); n > 0 {
		largest := r.Curve[n-1]
		peak := 0.0
		for _, p := range r.Curve {
			peak = max(peak, p.PeakRSSMB)
			s.CurveEventsPerSec = append(s.CurveEventsPerSec, math.Round(p.EventsPerSec))
		}
		s.PeakRSSMB = f64(peak)
		s.CPUSecondsPer100k = f64(largest.CPUPer100k)
		ev := largest.Events
		s.PeakRSSEvents = &ev
		inproc := largest.InProcess
		s.ResourcesInProcess = &inproc
	}
	if k := r.Soak; k != nil {
		if k.CapacitySagasPerSec > 0 {
			s.SoakCapacitySagasPerSec = f64(k.CapacitySagasPerSec)
		}
		for _, run := range k.Runs {
			sagas, rt := run.Sagas, run.Rate
			keys := soakKeys{&s.SoakSagas, &s.SoakRate, &s.SoakThroughputRatio, &s.SoakTableBytesGrowth, &s.SoakTableGrowthFromTenth,
				&s.SoakTableMBEnd, &s.SoakEndP99Ms, &s.SoakRSSMBMax, &s.SoakLoadMax}
			if !run.Retention {
				keys = soakKeys{&s.SoakNoretSagas, &s.SoakNoretRate, &s.SoakNoretThroughputRatio, &s.SoakNoretTableBytesGrowth, &s.SoakNoretGrowthFromTenth,
					&s.SoakNoretTableMBEnd, &s.SoakNoretEndP99Ms, &s.SoakNoretRSSMBMax, &s.SoakNoretLoadMax}
			}
			*keys.sagas, *keys.rate = &sagas, &rt
			*keys.ratio, *keys.growth, *keys.growthTenth = run.ThroughputRatio, run.TableBytesGrowth, run.TableBytesGrowthFromTenth
			*keys.tableMB = f64(float64(run.TableBytesEnd) / (1 << 20))
			*keys.p99 = run.TenthEndP99Ms
			*keys.rss, *keys.load = f64(run.RSSMBMax), f64(run.LoadMax)
		}
	}
	return s
}

// fromTenth shows the growth from the end of the first tenth.
func fromTenth(g *float64) string {
	if g == nil {
		return ""
	}
	return fmt.Sprintf(" (from the first tenth's end %.2f)", *g)
}

// soakKeys are one soak run's fields of the Summary (soak_ or soak_noret_).
type soakKeys struct {
	sagas, rate                         **int
	ratio, growth, growthTenth, tableMB **float64
	p99                                 *[]*float64
	rss, load                           **float64
}

// WriteFile writes the whole report, with its summary, as indented JSON to
// path: every pass behind the medians, for a reference run's record.
func (r *Report) WriteFile(path string) error {
	b, err := json.MarshalIndent(struct {
		Summary Summary `json:"summary"`
		*Report
	}{r.Summary(), r}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: write the report: %w", err)
	}
	return nil
}

// WriteJSON writes the summary as one line.
func (r *Report) WriteJSON(w io.Writer) error {
	b, err := json.Marshal(r.Summary())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WriteTable writes the human-readable results, with each target next to
// the figure it judges.
func (r *Report) WriteTable(w io.Writer) {
	m := r.Machine
	mode := "full"
	if r.Quick {
		mode = "quick"
	}
	fmt.Fprintf(w, "\nCompensa relay-bench (%s) — %d CPUs (%s), %d MB, %s, kernel %s, %s, PostgreSQL %s (%s, durable=%v)\n",
		mode, m.CPUs, m.CPUModel, m.MemoryMB, m.OS, m.Kernel, m.GoVersion, m.PostgreSQL, m.Server, m.Durable)
	fmt.Fprintf(w, "load average: %.2f at start, %.2f at end\n", m.LoadAtStart, m.LoadAtEnd)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(r.Stream) > 0 {
		fmt.Fprintln(tw, "\n1. stream throughput\tsource\tevents/tx\tevents\tpg_recvlogical ev/s\tstream ev/s\tratio b/a (≥0.9)\tstream+correlator ev/s\tratio c/a (≥0.5)\tlimit ev/s (decode + COPY)\tratio c/limit (≥0.8)\tevents/batch (b, c)\tsink busy (b, c)")
		for _, c := range r.Stream {
			fmt.Fprintf(tw, "\t%s\t%d\t%d\t%.0f\t%.0f\t%.2f %s\t%.0f\t%.2f %s\t%.0f\t%.2f %s\t%.1f, %.1f\t%.0f%%, %.0f%%\n",
				cmp.Or(c.Source, SourceRows), c.RowsPerTx, c.Events, c.RecvlogicalPerSec, c.StreamPerSec, c.StreamRatio, judge(c.StreamRatio >= 0.9, c.StreamRatioSpread),
				c.CorrelatePerSec, c.CorrelateRatio, judge(c.CorrelateRatio >= 0.5, c.CorrelateRatioSpread),
				c.CorrelateLimitPerSec, c.CorrelateLimitRatio, judge(c.CorrelateLimitRatio >= 0.8, c.CorrelateLimitRatioSpread),
				perBatch(c.Events, c.StreamBatches), perBatch(c.Events, c.CorrelateBatches), 100*c.StreamSinkBusy, 100*c.CorrelateSinkBusy)
		}
	}
	if len(r.Stream) > 0 && len(r.Stream[0].RecvlogicalRuns) > 1 {
		fmt.Fprintf(tw, "\t(medians of %d interleaved runs; each ratio is the median of the paired ratios)\n", len(r.Stream[0].RecvlogicalRuns))
	}
	if p := r.Producer; p != nil {
		fmt.Fprintln(tw, "\n   producer cost per event\tevents\trow µs/tx\tmessage µs/tx\tratio\trow WAL bytes\tmessage WAL bytes\tratio\trow delete+vacuum later: WAL bytes, µs\tratio with it")
		fmt.Fprintf(tw, "\t%d\t%.0f\t%.0f\t%.2f\t%.0f\t%.0f\t%.2f\t%.0f, %.1f\t%.2f\n", p.Events, p.RowTxMicros, p.MessageTxMicros, p.TxRatio,
			p.RowWALBytes, p.MessageWALBytes, p.WALRatio, p.RowCleanupWALBytes, p.RowCleanupMicros, p.WALRatioWithCleanup)
	}
	if c := r.Sinks; c != nil {
		fmt.Fprintln(tw, "\n   sinks (1 row/tx, no sagas)\tevents\tpg_recvlogical ev/s\tNATS sink ev/s\tratio (≥0.5)\twebhook sink ev/s\tratio")
		fmt.Fprintf(tw, "\t%d\t%.0f\t%.0f\t%.2f %s\t%.0f\t%.2f\n", c.Events, c.RecvlogicalPerSec, c.NATSPerSec, c.NATSRatio, judge(c.NATSRatio >= 0.5, c.NATSRatioSpread),
			c.WebhookPerSec, c.WebhookRatio)
		if c.RabbitMQPerSec > 0 || c.RedisPerSec > 0 {
			fmt.Fprintln(tw, "\t\t\tRabbitMQ sink ev/s\tratio\tRedis sink ev/s\tratio")
			fmt.Fprintf(tw, "\t\t\t%.0f\t%.2f\t%.0f\t%.2f\n", c.RabbitMQPerSec, c.RabbitMQRatio, c.RedisPerSec, c.RedisRatio)
		}
	}
	if len(r.SinkLatency) > 0 || len(r.SinkFloor) > 0 {
		fmt.Fprintln(tw, "\n   sink latency (ms, commit → ack)\tsink\trate ev/s\tachieved\tevents\tp50\tp95\tp99\tmax")
		for _, f := range r.SinkFloor {
			fmt.Fprintf(tw, "\tfloor (bare reader, receipt)\t%d\t\t%d\t%.1f\t%.1f\t%.1f\t%.1f\n", f.Rate, f.Latency.Count,
				f.Latency.P50, f.Latency.P95, f.Latency.P99, f.Latency.Max)
		}
		for _, c := range r.SinkLatency {
			target := ""
			if fl, ok := r.floorFor(c.Rate); ok {
				bound := 1.5*fl.P99 + 10
				target = fmt.Sprintf("\ttarget p99 ≤ 1.5 × floor + 10 = %.1f %s", bound, mark(c.Latency.P99 <= bound))
			}
			if c.Rate == 5000 && c.Sink != "kafka" {
				target += "\ttarget p99 < 50 " + mark(c.Latency.P99 < 50)
			}
			fmt.Fprintf(tw, "\t%s\t%d\t%.0f\t%d\t%.1f\t%.1f\t%.1f\t%.1f%s\n", c.Sink, c.Rate, c.AchievedRate, c.Latency.Count,
				c.Latency.P50, c.Latency.P95, c.Latency.P99, c.Latency.Max, target)
		}
	}
	if len(r.CorrelatorAlone) > 0 {
		fmt.Fprintln(tw, "\n   correlator alone (synthetic batches, no stream)\tevents/batch\tbatches\tevents/s\tbatches/s")
		for _, c := range r.CorrelatorAlone {
			fmt.Fprintf(tw, "\t%d\t%d\t%.0f\t%.0f\n", c.BatchEvents, c.Batches, c.EventsPerSec, c.BatchesPerSec)
		}
	}
	if len(r.Latency) > 0 {
		fmt.Fprintln(tw, "\n2. latency (ms)\trate ev/s\tachieved\tevents\tstart p50\tp95\tp99\tmax\tfirst step p50\tp95\tp99\tmax\tend p50\tp99\tsteps/s\tunfinished (start, step, end)")
		for i, c := range r.Latency {
			target := ""
			if i == 0 {
				target = fmt.Sprintf("\ttargets: start p99 < 50 %s, first step p99 < 100 %s, end p99 < 500 %s",
					mark(c.Start.P99 < 50 && c.StartUnfinished == 0), mark(c.FirstStep.P99 < 100 && c.FirstStepUnfinished == 0),
					mark(c.End.P99 < 500 && c.EndUnfinished == 0))
			}
			en := ""
			if c.EndUnfinished > 0 {
				en = "≥"
			}
			st, fs := "", ""
			if c.StartUnfinished > 0 {
				st = "≥"
			}
			if c.FirstStepUnfinished > 0 {
				fs = "≥"
			}
			fmt.Fprintf(tw, "\t%d\t%.0f\t%d\t%s%.1f\t%s%.1f\t%s%.1f\t%s%.1f\t%s%.1f\t%s%.1f\t%s%.1f\t%s%.1f\t%s%.1f\t%s%.1f\t%.0f\t%d, %d, %d%s\n",
				c.Rate, c.AchievedRate, c.Produced, st, c.Start.P50, st, c.Start.P95, st, c.Start.P99, st, c.Start.Max,
				fs, c.FirstStep.P50, fs, c.FirstStep.P95, fs, c.FirstStep.P99, fs, c.FirstStep.Max,
				en, c.End.P50, en, c.End.P99, c.StepsPerSec,
				c.StartUnfinished, c.FirstStepUnfinished, c.EndUnfinished, target)
		}
		if len(r.Latency) > 0 {
			fmt.Fprintln(tw, "\t(≥: some events had no saga start or first step when the wait ended; they count with the time waited, so the figure is a lower bound)")
		}
	}
	if st := r.Steps; st != nil {
		fmt.Fprintln(tw, "\n3. step throughput\tsagas×steps\tworkers\tseconds\tsteps/s\tpgbench tps (INSERT+UPDATE, 8 clients)\tratio (≥0.7)\tclaims\tinstances/claim\tclaim s\tHOT updates")
		fmt.Fprintf(tw, "\t%d×%d\t%d\t%.1f\t%.0f\t%.0f\t%.2f %s\t%d\t%.1f\t%.1f\t%.0f%%\n", st.Sagas, st.StepsPerSaga, st.Workers, st.Seconds, st.StepsPerSec, st.PgbenchTPS, st.Ratio, judge(st.Ratio >= 0.7, st.RatioSpread),
			st.Claims, st.PerClaim, st.ClaimSeconds, 100*st.HotShare)
		if st.PeerDBOS != nil || st.PeerRiver != nil {
			fmt.Fprintln(tw, "\n   peers, same workload (bench/peers)\tDBOS steps/s\tRiver steps/s\tRiver 1 ms cooldown steps/s\tours ÷ DBOS (≥2)\tours ÷ River (≥3)\tours ÷ River 1 ms")
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%s\t%s\n", fmtPtr(st.PeerDBOS), fmtPtr(st.PeerRiver), fmtPtr(st.PeerRiverFast),
				times(st.StepsPerSec, st.PeerDBOS), times(st.StepsPerSec, st.PeerRiver), times(st.StepsPerSec, st.PeerRiverFast))
		}
	}
	if st := r.Steps; st != nil && st.ServerMsPerStep != nil {
		fmt.Fprintf(tw, "\n   server time per step, every statement (pg_stat_statements)\t%.3f ms (target ≤ 0.25) %s\tpgbench per transaction\t%s ms\n",
			*st.ServerMsPerStep, mark(*st.ServerMsPerStep <= 0.25), fmtMs(st.PgbenchServerMsPerTx))
	}
	if st := r.Steps; st != nil && len(st.Statements) > 0 {
		fmt.Fprintln(tw, "\n   server time per statement (last slice of the last run, pg_stat_statements)\tcalls\tmean ms\tms per step\tWAL bytes/call\tstatement")
		for _, c := range st.Statements {
			fmt.Fprintf(tw, "\t%d\t%.3f\t%.3f\t%.0f\t%s\n", c.Calls, c.MeanMs, c.PerStepMs, c.WALBytesPerCall, c.Query)
		}
		for _, c := range st.PgbenchStatements {
			fmt.Fprintf(tw, "\t%d\t%.3f\t%.3f\t%.0f\tpgbench: %s\n", c.Calls, c.MeanMs, c.PerStepMs, c.WALBytesPerCall, c.Query)
		}
	}
	if c := r.Capacity; c != nil {
		fmt.Fprintln(tw, "\n3c. capacity (whole relay, 3-step sagas)\tsustainable sagas/s\tramp: sagas/s asked → triggers committed/s → sagas completed/s")
		for i, st := range c.Ramp {
			held, capacity := "not sustained", ""
			if st.Sustained {
				held = "sustained"
			}
			if i == 0 {
				capacity = fmt.Sprintf("%.0f", c.SagasPerSec)
			}
			fmt.Fprintf(tw, "\t%s\t%d → %.0f → %.0f %s\n", capacity, st.Rate, st.ProducedPerSec, st.CompletedPerSec, held)
		}
		fmt.Fprintln(tw, "\n   latency at a share of capacity (ms)\tshare\trate sagas/s\tachieved\tevents\tstart p50\tp99\tfirst step p50\tp99\tend p50\tp99\tsteps/s\tunfinished (start, step, end)")
		row := func(label string, l LatencyCase, target string) {
			st, fs, en := lowerBound(l.StartUnfinished), lowerBound(l.FirstStepUnfinished), lowerBound(l.EndUnfinished)
			fmt.Fprintf(tw, "\t%s\t%d\t%.0f\t%d\t%s%.1f\t%s%.1f\t%s%.1f\t%s%.1f\t%s%.1f\t%s%.1f\t%.0f\t%d, %d, %d%s\n",
				label, l.Rate, l.AchievedRate, l.Produced, st, l.Start.P50, st, l.Start.P99, fs, l.FirstStep.P50, fs, l.FirstStep.P99,
				en, l.End.P50, en, l.End.P99, l.StepsPerSec, l.StartUnfinished, l.FirstStepUnfinished, l.EndUnfinished, target)
		}
		for _, l := range c.Levels {
			target := ""
			switch l.Percent {
			case 50:
				target = fmt.Sprintf("\ttargets: first step p99 < 50 %s, end p99 < 250 %s",
					mark(l.FirstStep.P99 < 50 && l.FirstStepUnfinished == 0), mark(l.End.P99 < 250 && l.EndUnfinished == 0))
			case 75:
				target = fmt.Sprintf("\ttarget: end p99 < 1000 %s", mark(l.End.P99 < 1000 && l.EndUnfinished == 0))
			}
			row(fmt.Sprintf("%d %%", l.Percent), l.LatencyCase, target)
		}
		if o := r.Overload; o != nil && c.SagasPerSec > 0 {
			ratio := o.StepsPerSec / (c.SagasPerSec * benchStepsPerSaga)
			row("200 % (overload)", *o, fmt.Sprintf("\toverload_steps_ratio: steps/s %.2f of the sustainable %.0f (≥0.9) %s",
				ratio, c.SagasPerSec*benchStepsPerSaga, mark(ratio >= 0.9)))
		}
		fmt.Fprintln(tw, "\t(≥: some sagas had not started, taken their first step or ended when the wait ended; they count with the time waited, a lower bound)")
	}
	if len(r.Claim) > 0 {
		fmt.Fprintln(tw, "\n   claim and start cost vs backlog\tdue instances\tclaim of 8 ms (median)\tcorrelator start of 1,000 ms (median)")
		for _, c := range r.Claim {
			fmt.Fprintf(tw, "\t%d\t%.2f\t%.1f\n", c.Due, c.ClaimMs, c.StartMs)
		}
		if n := len(r.Claim); n > 1 && r.Claim[0].ClaimMs > 0 {
			big := r.Claim[n-1]
			ratio := big.ClaimMs / r.Claim[0].ClaimMs
			fmt.Fprintf(tw, "\t(claim at %d ÷ at %d: %.2f, target ≤ 2 %s; start: %.2f)\n", big.Due, r.Claim[0].Due, ratio, mark(ratio <= 2), big.StartMs/r.Claim[0].StartMs)
		}
	}
	if len(r.ClaimTenants) > 0 {
		fmt.Fprintln(tw, "\n   claim shared between tenants\tdue instances\ttenants\tclaim of 8 ms (median)")
		for _, c := range r.ClaimTenants {
			fmt.Fprintf(tw, "\t%d\t%d\t%.2f\n", c.Due, c.Tenants, c.ClaimMs)
		}
		if n := len(r.ClaimTenants); n > 1 && r.ClaimTenants[0].ClaimMs > 0 {
			big := r.ClaimTenants[n-1]
			ratio := big.ClaimMs / r.ClaimTenants[0].ClaimMs
			fmt.Fprintf(tw, "\t(claim at %d ÷ at %d: %.2f, target ≤ 2 %s)\n", big.Due, r.ClaimTenants[0].Due, ratio, mark(ratio <= 2))
		}
	}
	if d := r.Declared; d != nil {
		fmt.Fprintln(tw, "\n3b. declared steps\tsagas×steps\tGo steps/s\tdeclared steps/s\tdeclared_step_ratio (≥0.9)")
		fmt.Fprintf(tw, "\t%d×%d\t%.0f\t%.0f\t%.2f %s\n", d.Sagas, benchStepsPerSaga, d.GoStepsPerSec, d.DeclaredStepsPerSec, d.Ratio, mark(d.Ratio >= 0.9))
	}
	if len(r.Curve) > 0 {
		fmt.Fprintln(tw, "\n4/5. stream+correlator cost curve\tevents\trows/tx\tseconds\tevents/s\tpeak RSS MB (<150 at 1M)\tCPU s\tCPU s per 100k events\tmeasured")
		for _, p := range r.Curve {
			where := "child relay process"
			if p.InProcess {
				where = "in the bench process"
			}
			fmt.Fprintf(tw, "\t%d\t%d\t%.1f\t%.0f\t%.1f\t%.1f\t%.2f\t%s\n", p.Events, p.RowsPerTx, p.Seconds, p.EventsPerSec, p.PeakRSSMB, p.CPUSeconds, p.CPUPer100k, where)
		}
	}
	if k := r.Soak; k != nil && len(k.Runs) > 0 {
		how := fmt.Sprintf("%d %% of %.0f sagas/s sustained", soakShare, k.CapacitySagasPerSec)
		if k.RateGiven {
			how = "rate given"
		}
		fmt.Fprintf(tw, "\n6. soak (3-step sagas, %s)\trun\tsagas\trate asked → achieved\tminutes\tsagas/s last/first tenth (≥0.9)\ttable MB at ref → end\tgrowth (≤1.25 with retention)\tend p50/p99/max ms\tRSS max MB\tload max\n", how)
		for _, run := range k.Runs {
			growth, ok := "-", "MISSED"
			if g := run.TableBytesGrowth; g != nil {
				growth = fmt.Sprintf("%.2f", *g)
				if *g <= 1.25 {
					ok = "ok"
				}
			}
			if !run.Retention {
				ok = "(none kept down)"
			}
			tr := deref(run.ThroughputRatio)
			fmt.Fprintf(tw, "\t%s\t%d\t%d → %.0f\t%.1f\t%.2f %s\t%.1f → %.1f (ref %.0f s)\t%s %s\t%s%.1f/%.1f/%.1f\t%.0f\t%.2f\n",
				run.Name, run.Sagas, run.Rate, run.AchievedRate, run.Seconds/60, tr, mark(tr >= 0.9),
				float64(run.TableBytesAtReference)/(1<<20), float64(run.TableBytesEnd)/(1<<20), run.ReferenceSec, growth+fromTenth(run.TableBytesGrowthFromTenth), ok,
				lowerBound(run.EndUnfinished), run.End.P50, run.End.P99, run.End.Max, run.RSSMBMax, run.LoadMax)
		}
		// After the rows: a line with fewer cells would end tabwriter's
		// column blocks and misalign the next run's row.
		for _, run := range k.Runs {
			fmt.Fprintf(tw, "\t%s: end p99 ms per tenth %s; sagas/s per tenth %s; as `%s`\n", run.Name, roundAll(derefAll(run.TenthEndP99Ms), 1), roundAll(run.TenthSagasPerSec, 0), run.Command)
		}
		if k.Plot != "" {
			fmt.Fprintf(tw, "\t(plot: %s; series beside it in .json)\n", k.Plot)
		}
	}
	tw.Flush()
	if len(r.LoadAverage) > 0 {
		var parts []string
		for _, l := range r.LoadAverage {
			parts = append(parts, fmt.Sprintf("%s %.2f→%.2f", l.Scenario, l.Before, l.After))
		}
		fmt.Fprintf(w, "\nload average per scenario: %s\n", strings.Join(parts, ", "))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "FAILED: %s\n", e)
	}
}

func fmtPtr(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f", *v)
}

func fmtMs(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.3f", *v)
}

func times(ours float64, peer *float64) string {
	if peer == nil || *peer == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", ours / *peer)
}

// lowerBound marks a percentile that counts unfinished samples with the time
// waited.
func lowerBound(unfinished int) string {
	if unfinished > 0 {
		return "≥"
	}
	return ""
}

// judge is mark for a median figure whose passes spread by sp: past
// unreliableSpread the passes disagree too much to call the target either
// way.
func judge(ok bool, sp *float64) string {
	if sp != nil && *sp > unreliableSpread {
		return fmt.Sprintf("UNRELIABLE (spread %.0f%%)", 100**sp)
	}
	return mark(ok)
}

func mark(ok bool) string {
	if ok {
		return "ok"
	}
	return "MISSED"
}

func perBatch(events, batches int) float64 {
	if batches == 0 {
		return 0
	}
	return float64(events) / float64(batches)
}
