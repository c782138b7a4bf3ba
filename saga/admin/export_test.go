package admin

// OverviewStatements are the overview's statements, for the scale test to
// time one by one.
var OverviewStatements = map[string]string{
	"counts": sqlOverviewCounts, "per_minute": sqlOverviewPerMinute, "durations": sqlOverviewDurations, "errors": sqlOverviewErrors,
}
