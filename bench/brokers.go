package bench

import (
	"context"
	"errors"
	"fmt"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/compensa/compensa/test/rabbittest"
	"github.com/compensa/compensa/test/redistest"
)

// brokerServers are the RabbitMQ node and the Redis server the sink
// scenarios deliver to: the distribution's binaries (make brokers), each
// a process of its own in a temporary folder, as the tests run them.
// Either is nil when its binary is missing: the scenarios then leave that
// sink out and say so in the report's notes.
type brokerServers struct {
	rabbit *rabbittest.Server
	redis  *redistest.Server
	dirs   []string
}

// startBrokers starts what is installed; note records what is not.
func startBrokers(note func(string)) (*brokerServers, error) {
	b := &brokerServers{}
	dir, err := os.MkdirTemp("", "bench-rabbitmq")
	if err != nil {
		return nil, err
	}
	b.dirs = append(b.dirs, dir)
	switch b.rabbit, err = rabbittest.StartProcess(dir); {
	case errors.Is(err, rabbittest.ErrMissing):
		note("rabbitmq sink not measured: " + err.Error())
	case err != nil:
		b.close()
		return nil, fmt.Errorf("bench: start RabbitMQ: %w", err)
	}
	if dir, err = os.MkdirTemp("", "bench-redis"); err != nil {
		b.close()
		return nil, err
	}
	b.dirs = append(b.dirs, dir)
	switch b.redis, err = redistest.StartProcess(dir); {
	case errors.Is(err, redistest.ErrMissing):
		note("redis sink not measured: " + err.Error())
	case err != nil:
		b.close()
		return nil, fmt.Errorf("bench: start Redis: %w", err)
	}
	return b, nil
}

func (b *brokerServers) close() {
	if b.rabbit != nil {
		b.rabbit.Stop()
	}
	if b.redis != nil {
		b.redis.Stop()
	}
	for _, d := range b.dirs {
		os.RemoveAll(d)
	}
}

// rabbitTopology declares what an operator would: a durable topic exchange
// and a durable queue bound to every key under it, emptied.
func (b *brokerServers) rabbitTopology(exchange string) error {
	conn, err := b.rabbit.Dial()
	if err != nil {
		return fmt.Errorf("bench: connect to RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(exchange, true, false, false, false, amqp.Table{}); err != nil {
		return err
	}
	if err := ch.QueueBind(exchange, "#", exchange, false, nil); err != nil {
		return err
	}
	_, err = ch.QueuePurge(exchange, false)
	return err
}

// flushRedis empties the Redis database between runs.
func (b *brokerServers) flushRedis(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: b.redis.Addr(), Password: b.redis.Password})
	defer c.Close()
	return c.FlushAll(ctx).Err()
}
