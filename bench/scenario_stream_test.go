package bench

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The stream scenario's CPU meter reads a process's own time and its reaped
// children's from /proc, and the time of reaped children of the bench: a
// child that burns CPU shows up in both, a process it did not start in
// neither.
func TestCPUMeterCountsReapedChildren(t *testing.T) {
	t.Parallel()
	_, reaped0, ok := procTimes(os.Getpid())
	if !ok {
		t.Fatal("procTimes cannot read this process")
	}
	u0, s0 := childrenCPU()
	// A fixed amount of work (a few tenths of a second of CPU, whatever
	// the load) in a child that exits and is reaped.
	cmd := exec.Command("sh", "-c", `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done`)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	u1, s1 := childrenCPU()
	_, reaped1, _ := procTimes(os.Getpid())
	if got := (u1 - u0) + (s1 - s0); got < 50*time.Millisecond {
		t.Fatalf("children's CPU grew by %s, want a few tenths of a second", got)
	}
	if got := reaped1 - reaped0; got < 50*time.Millisecond {
		t.Fatalf("reaped children's CPU in /proc grew by %s, want a few tenths of a second", got)
	}
	if _, _, ok := procTimes(1 << 30); ok {
		t.Fatal("procTimes read a process that does not exist")
	}
	if _, ok := (&env{}).serverCPU(); ok {
		t.Fatal("serverCPU reported a server the bench did not start")
	}
	if s := (cpuMeter{e: &env{}}).stop(1000); !strings.Contains(s, "pg_recvlogical") || strings.Contains(s, "PostgreSQL") {
		t.Fatalf("meter text %q", s)
	}
}
