package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/compensa/compensa/internal/cliflag"
	"github.com/compensa/compensa/internal/dbconn"
)

// rootOptions are the flags every command shares. Each flag falls back to an
// environment variable (RELAY_<FLAG>), and --database-url also to DATABASE_URL.
type rootOptions struct {
	DatabaseURL   string
	Slot          string
	Publication   string
	HTTPAddr      string
	OutboxTable   string
	OutboxColumns string
	logLevel      string
	// extraSecrets are values (an API token given as a flag) that logs and
	// errors must never show.
	extraSecrets []string
}

// bindTo adds the named shared flags to fs: each command names those that
// mean something to it (no --slot for `relay version`, no --database-url for
// `relay demo`, which starts its own database). An unknown name is a
// mistake in the command's declaration.
func (o *rootOptions) bindTo(fs *pflag.FlagSet, names ...string) {
	all := pflag.NewFlagSet("shared", pflag.ContinueOnError)
	o.bind(all)
	for _, n := range names {
		f := all.Lookup(n)
		if f == nil {
			panic("no shared flag --" + n)
		}
		if fs.Lookup(n) == nil {
			fs.AddFlag(f)
		}
	}
}

func (o *rootOptions) bind(f *pflag.FlagSet) {
	f.StringVar(&o.DatabaseURL, "database-url", "", "PostgreSQL URL (env RELAY_DATABASE_URL, then DATABASE_URL)")
	f.Var(cliflag.SlotName(&o.Slot, "relay_outbox"), "slot", "logical replication slot name (env RELAY_SLOT)")
	f.StringVar(&o.Publication, "publication", "relay_outbox_pub", "publication name (env RELAY_PUBLICATION)")
	f.Var(cliflag.Address(&o.HTTPAddr, "127.0.0.1:8080"), "http-addr", "address of the HTTP monitor (env RELAY_HTTP_ADDR)")
	f.Var(cliflag.TableName(&o.OutboxTable, "outbox"), "outbox-table", "outbox table, schema-qualified allowed (env RELAY_OUTBOX_TABLE)")
	f.Var(cliflag.ColumnMap(&o.OutboxColumns, ""), "outbox-columns", "map of field=column for an existing outbox table, e.g. id=id,event_type=type (env RELAY_OUTBOX_COLUMNS)")
	f.Var(cliflag.NewEnum(&o.logLevel, "info", "level", logLevels...), "log-level", "debug, info, warn or error (env RELAY_LOG_LEVEL)")
}

// logLevels are the levels of log/slog that --log-level names.
var logLevels = []string{"debug", "info", "warn", "error"}

// resolve applies environment fallbacks to every flag the user did not set,
// on the command's own flags and the persistent ones.
func (o *rootOptions) resolve(cmd *cobra.Command) error {
	var err error
	apply := func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		env := "RELAY_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := os.LookupEnv(env)
		if !ok && f.Name == "database-url" {
			v, ok = os.LookupEnv("DATABASE_URL")
		}
		if ok {
			// The same Set as on the command line: the same rule.
			if serr := f.Value.Set(v); serr != nil {
				err = fmt.Errorf("%s=%q: %s", env, v, refusal(f, serr))
			}
		}
	}
	cmd.Flags().VisitAll(apply)
	cmd.InheritedFlags().VisitAll(apply)
	return err
}

// requireDatabase returns the URL or an error that says how to give one.
func (o *rootOptions) requireDatabase() (string, error) {
	if o.DatabaseURL == "" {
		return "", fmt.Errorf("no database: pass --database-url postgres://user:password@host:5432/db or set RELAY_DATABASE_URL")
	}
	return o.DatabaseURL, nil
}

func (o *rootOptions) secrets() []string {
	var s []string
	// Every password the DSN holds as far as it can be told, also when it
	// does not parse: a malformed DSN is the one most likely to be quoted.
	s = append(s, dbconn.Passwords(o.DatabaseURL)...)
	if t := os.Getenv("RELAY_API_TOKEN"); t != "" {
		s = append(s, t)
	}
	for _, x := range o.extraSecrets {
		if x != "" {
			s = append(s, x)
		}
	}
	return s
}
