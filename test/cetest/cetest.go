// Package cetest decodes what the relay's sinks send in a cloudevents
// format with the CloudEvents Go SDK, as a consumer would: tests use it to
// check the relay's own encoding against the SDK. HTTP requests go through
// the SDK's HTTP protocol binding; NATS and Kafka messages (whose protocol
// binding modules are separate modules) through the SDK's binding, spec and
// format packages, reading headers exactly as those bindings do.
package cetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
)

// HTTP decodes a webhook request (binary or structured content mode).
func HTTP(r *http.Request) (*event.Event, error) {
	return binding.ToEvent(context.Background(), cehttp.NewMessageFromHttpRequest(r))
}

// HTTPParts decodes a webhook request from its headers and body.
func HTTPParts(h http.Header, body []byte) (*event.Event, error) {
	return binding.ToEvent(context.Background(), cehttp.NewMessage(h, io.NopCloser(bytes.NewReader(body))))
}

// NATS decodes a NATS message: attributes in ce- headers, datacontenttype
// in content-type (binary mode), or an application/cloudevents+json body.
func NATS(headers map[string]string, body []byte) (*event.Event, error) {
	return decode("ce-", "content-type", headers, body)
}

// Kafka decodes a Kafka record: attributes in ce_ headers, datacontenttype
// in content-type (binary mode), or an application/cloudevents+json value.
func Kafka(headers map[string]string, body []byte) (*event.Event, error) {
	return decode("ce_", "content-type", headers, body)
}

func decode(prefix, ctKey string, headers map[string]string, body []byte) (*event.Event, error) {
	m := &message{vs: spec.WithPrefix(prefix), ctKey: ctKey, headers: headers, body: body}
	return binding.ToEvent(context.Background(), m)
}

// message is a binding.MessageReader over headers and a body.
type message struct {
	vs      *spec.Versions
	ctKey   string
	headers map[string]string
	body    []byte
}

func (m *message) version() spec.Version {
	return m.vs.Version(m.headers[m.vs.PrefixedSpecVersionName()])
}

func (m *message) ReadEncoding() binding.Encoding {
	if m.version() != nil {
		return binding.EncodingBinary
	}
	if format.Lookup(m.headers[m.ctKey]) != nil {
		return binding.EncodingStructured
	}
	return binding.EncodingUnknown
}

func (m *message) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	f := format.Lookup(m.headers[m.ctKey])
	if f == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, f, bytes.NewReader(m.body))
}

func (m *message) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	v := m.version()
	if v == nil {
		return binding.ErrNotBinary
	}
	for k, val := range m.headers {
		var err error
		switch {
		case k == m.ctKey:
			err = w.SetAttribute(v.AttributeFromKind(spec.DataContentType), val)
		case v.Attribute(k) != nil:
			err = w.SetAttribute(v.Attribute(k), val)
		case strings.HasPrefix(k, m.vs.Prefix()):
			err = w.SetExtension(strings.ToLower(strings.TrimPrefix(k, m.vs.Prefix())), val)
		}
		if err != nil {
			return fmt.Errorf("header %s: %w", k, err)
		}
	}
	if len(m.body) > 0 {
		return w.SetData(bytes.NewReader(m.body))
	}
	return nil
}

func (m *message) Finish(error) error { return nil }

// GetAttribute and GetExtension make message a binding.MessageMetadataReader,
// which binding.ToEvent needs of a binary message.
func (m *message) GetAttribute(k spec.Kind) (spec.Attribute, interface{}) {
	v := m.version()
	if v == nil {
		return nil, nil
	}
	a := v.AttributeFromKind(k)
	if a == nil {
		return nil, nil
	}
	key := a.PrefixedName()
	if k == spec.DataContentType {
		key = m.ctKey
	}
	if s, ok := m.headers[key]; ok {
		return a, s
	}
	return a, nil
}

func (m *message) GetExtension(name string) interface{} {
	if s, ok := m.headers[m.vs.Prefix()+name]; ok {
		return s
	}
	return nil
}
