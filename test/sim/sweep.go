package sim

// Sweep runs seeds first..first+n-1 without a mutant. It returns every
// failing result and the totals of all runs.
func Sweep(first uint64, n int, base Config) (failed []Result, total Stats) {
	for s := first; s < first+uint64(n); s++ {
		cfg := base
		cfg.Seed = s
		r := Run(cfg)
		total = addStats(total, r.Stats)
		if r.Failed() {
			failed = append(failed, r)
		}
	}
	return failed, total
}

// Catch runs seeds from 1 up to limit with mutant m planted and returns
// the first run whose invariants caught it (ok false when none did).
func Catch(m Mutant, limit int, base Config) (Result, bool) {
	for s := uint64(1); s <= uint64(limit); s++ {
		cfg := base
		cfg.Seed = s
		cfg.Mutant = m
		if r := Run(cfg); r.Failed() {
			return r, true
		}
	}
	return Result{}, false
}

func addStats(a, b Stats) Stats {
	a.Ticks += b.Ticks
	a.Instances += b.Instances
	a.Completed += b.Completed
	a.Compensated += b.Compensated
	a.Failed += b.Failed
	a.Events += b.Events
	a.Effects += b.Effects
	a.StaleRefused += b.StaleRefused
	a.DuplicateStarts += b.DuplicateStarts
	a.RepliesLate += b.RepliesLate
	a.RepliesDuplicate += b.RepliesDuplicate
	a.RepliesForeign += b.RepliesForeign
	a.Held += b.Held
	a.UnrecordedActs += b.UnrecordedActs
	a.UncompensatedActs += b.UncompensatedActs
	a.Interrupted += b.Interrupted
	a.NeedlessCompensations += b.NeedlessCompensations
	return a
}
