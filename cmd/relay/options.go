package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

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

// bindTo adds the named shared flags to fs (see sharedFlagsOf).
func (o *rootOptions) bindTo(fs *pflag.FlagSet, names []string) {
	all := pflag.NewFlagSet("shared", pflag.ContinueOnError)
	o.bind(all)
	for _, n := range names {
		if f := all.Lookup(n); f != nil && fs.Lookup(n) == nil {
			fs.AddFlag(f)
		}
	}
}

func (o *rootOptions) bind(f *pflag.FlagSet) {
	f.StringVar(&o.DatabaseURL, "database-url", "", "PostgreSQL URL (env RELAY_DATABASE_URL, then DATABASE_URL)")
	f.StringVar(&o.Slot, "slot", "relay_outbox", "logical replication slot name (env RELAY_SLOT)")
	f.StringVar(&o.Publication, "publication", "relay_outbox_pub", "publication name (env RELAY_PUBLICATION)")
	f.StringVar(&o.HTTPAddr, "http-addr", "127.0.0.1:8080", "address of the HTTP monitor (env RELAY_HTTP_ADDR)")
	f.StringVar(&o.OutboxTable, "outbox-table", "outbox", "outbox table, schema-qualified allowed (env RELAY_OUTBOX_TABLE)")
	f.StringVar(&o.OutboxColumns, "outbox-columns", "", "map of field=column for an existing outbox table, e.g. id=id,event_type=type (env RELAY_OUTBOX_COLUMNS)")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error (env RELAY_LOG_LEVEL)")
}

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
			if serr := f.Value.Set(v); serr != nil {
				err = fmt.Errorf("%s=%q: %v", env, v, serr)
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
