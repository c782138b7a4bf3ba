package rabbitsink

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/compensa/compensa/sink"
)

// Message builds the publishing of ev as Deliver does.
func (s *Sink) Message(ev *sink.Event) (amqp.Publishing, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	msg, _, err := s.message(ev)
	return msg, err
}

// FrameMax is the frame_max negotiated on the sink's connection (0 before
// it connected).
func (s *Sink) FrameMax() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.frameMax
}
