package pgcluster

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions names a standby's physical slot on the primary and,
// optionally, its port (zero picks a free one; a fixed port lets a client's
// multi-host URL name a standby made after a failover).
type StandbyOptions struct {
	Slot string
	Port int
}

// StartStandby makes a hot standby of c and starts it. The standby is a cold
// copy of c's data folder (c is stopped for the copy and started again on
// the same port), streaming from c through the physical slot o.Slot, with
// hot_standby_feedback on and, on PostgreSQL 17 and later,
// sync_replication_slots on so that failover logical slots are synchronized.
// On 17+ the primary also lists the slot in synchronized_standby_slots, so
// that no logical consumer gets ahead of the standby. Replication slots of
// the primary are not copied: the standby gets the synchronized ones only.
func (c *Cluster) StartStandby(ctx context.Context, o StandbyOptions) (*Cluster, error) {
	slotName := o.Slot
	if c.Kind != KindLocal {
		return nil, fmt.Errorf("pgcluster: a standby needs a local primary, this one is %s", c.Kind)
	}
	major, err := c.prepareStandbySlot(ctx, slotName)
	if err != nil {
		return nil, err
	}

	dir, err := os.MkdirTemp("", "compensa-pg-standby-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: temp dir: %w", err)
	}
	s := &Cluster{Kind: KindLocal, BinDir: c.BinDir, DataDir: filepath.Join(dir, "data"), dir: dir, cred: c.cred, opts: c.opts}
	fail := func(err error) (*Cluster, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if s.cred != nil {
		os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid))
		os.Chmod(dir, 0o755)
	}
	c.kill(syscall.SIGINT) // a clean shutdown: the copy needs no recovery of its own
	cp := exec.CommandContext(ctx, "cp", "-a", c.DataDir, s.DataDir)
	out, cpErr := cp.CombinedOutput()
	if err := c.launch(c.opts.Log); err != nil {
		return fail(err)
	}
	if err := c.waitReady(ctx, 60*time.Second); err != nil {
		return fail(fmt.Errorf("pgcluster: primary did not come back after the copy: %w", err))
	}
	if cpErr != nil {
		return fail(fmt.Errorf("pgcluster: copy the data folder: %v\n%s", cpErr, out))
	}
	os.Remove(filepath.Join(s.DataDir, "postmaster.pid"))
	slots, _ := filepath.Glob(filepath.Join(s.DataDir, "pg_replslot", "*"))
	for _, p := range slots {
		os.RemoveAll(p)
	}
	if err := s.configureStandby(c, slotName, major); err != nil {
		return fail(err)
	}
	var lastErr error
	for try := 0; try < 5; try++ {
		port, err := freePort()
		if err != nil {
			return fail(err)
		}
		if o.Port != 0 {
			port = o.Port
		}
		s.Port = port
		s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
		if lastErr = s.launch(s.opts.Log); lastErr != nil {
			continue
		}
		if lastErr = s.waitReady(ctx, 60*time.Second); lastErr == nil {
			s.stopFn = s.stopLocal
			return s, nil
		}
		s.kill(syscall.SIGQUIT)
	}
	return fail(fmt.Errorf("pgcluster: standby did not start: %w", lastErr))
}

// Kill ends the server as a crash would: SIGKILL to the postmaster and its
// children, no shutdown checkpoint. Stop still removes the files afterwards.
func (c *Cluster) Kill() {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// Promote turns a standby into a primary and waits until it accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
		return fmt.Errorf("pgcluster: promote: %w", err)
	}
	if !ok {
		return fmt.Errorf("pgcluster: promote: not done within 60 s")
	}
	return nil
}

// InRecovery reports whether the server is a standby.
func (c *Cluster) InRecovery(ctx context.Context) (bool, error) {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	var r bool
	err = conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&r)
	return r, err
}

// MultiHostURL names several servers in one URL, for database, with
// target_session_attrs=read-write: a client following it connects to
// whichever of them is the primary.
func MultiHostURL(database string, servers ...*Cluster) string {
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(s.Port)
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + url.PathEscape(database) +
		"?sslmode=disable&target_session_attrs=read-write"
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// prepareStandbySlot creates the physical slot a standby streams through
// and, on 17+, adds it to synchronized_standby_slots. It returns the major
// version.
func (c *Cluster) prepareStandbySlot(ctx context.Context, slotName string) (int, error) {
	major, err := c.Major(ctx)
	if err != nil {
		return 0, err
	}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", slotName)
	if err == nil && major >= 17 {
		var cur string
		if err = conn.QueryRow(ctx, "SELECT current_setting('synchronized_standby_slots')").Scan(&cur); err == nil {
			list := slotName
			if strings.TrimSpace(cur) != "" {
				list = cur + "," + slotName
			}
			if _, err = conn.Exec(ctx, "ALTER SYSTEM SET synchronized_standby_slots = "+quoteLiteral(list)); err == nil {
				_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
			}
		}
	}
	if err != nil {
		return 0, fmt.Errorf("pgcluster: prepare the primary for a standby: %w", err)
	}
	return major, nil
}

// configureStandby writes standby.signal into s's data folder and sets its
// server settings to stream from primary through slotName.
func (s *Cluster) configureStandby(primary *Cluster, slotName string, major int) error {
	// The primary's synchronized_standby_slots may be in
	// postgresql.auto.conf; once this standby is promoted it has no standby
	// of its own to wait for (until one is made, which sets it again).
	auto := filepath.Join(s.DataDir, "postgresql.auto.conf")
	if b, err := os.ReadFile(auto); err == nil {
		var keep []string
		for _, l := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(strings.TrimSpace(l), "synchronized_standby_slots") {
				keep = append(keep, l)
			}
		}
		os.WriteFile(auto, []byte(strings.Join(keep, "\n")), 0o600)
	}
	signal := filepath.Join(s.DataDir, "standby.signal")
	if err := os.WriteFile(signal, nil, 0o600); err != nil {
		return err
	}
	if s.cred != nil {
		os.Chown(signal, int(s.cred.Uid), int(s.cred.Gid))
	}
	extra := map[string]string{
		"hot_standby":          "on",
		"hot_standby_feedback": "on",
		"primary_slot_name":    slotName,
		// dbname is what the slot synchronization worker connects to.
		"primary_conninfo": fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres", primary.Port),
	}
	if major >= 17 {
		extra["sync_replication_slots"] = "on"
	}
	opts := primary.opts
	opts.Settings = map[string]string{}
	for k, v := range primary.opts.Settings {
		opts.Settings[k] = v
	}
	for k, v := range extra {
		opts.Settings[k] = v
	}
	s.opts = opts
	s.settings = append(baseSettings(opts), "-c", "unix_socket_directories="+s.dir)
	return nil
}

// Shutdown stops the server cleanly (a fast shutdown: connected standbys
// receive the WAL up to the shutdown checkpoint), keeping its files, as for
// a planned switchover.
func (c *Cluster) Shutdown() { c.kill(syscall.SIGINT) }

// Rejoin starts c again, after a clean Shutdown, as a hot standby of
// primary (which was c's standby and has been promoted), streaming through
// the physical slot slotName that it creates on primary: the old primary
// of a planned switchover. Logical slots c still holds from its time as
// primary are dropped, so that the synchronized ones replace them.
func (c *Cluster) Rejoin(ctx context.Context, primary *Cluster, slotName string) error {
	major, err := primary.prepareStandbySlot(ctx, slotName)
	if err != nil {
		return err
	}
	if err := c.configureStandby(primary, slotName, major); err != nil {
		return err
	}
	if err := c.launch(c.opts.Log); err != nil {
		return err
	}
	if err := c.waitReady(ctx, 60*time.Second); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	q := "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_type = 'logical'"
	if major >= 17 {
		q += " AND NOT synced"
	}
	if _, err := conn.Exec(ctx, q); err != nil {
		return fmt.Errorf("pgcluster: drop the old logical slots: %w", err)
	}
	return nil
}
