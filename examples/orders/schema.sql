-- The orders example's application tables (the relay's own come from relay migrate).
CREATE TABLE IF NOT EXISTS orders (
    id     uuid PRIMARY KEY,
    status   text NOT NULL DEFAULT 'PLACED',
    tracking text  -- the shipping service's reply, set by the saga's confirm step
);
CREATE TABLE IF NOT EXISTS stock (
    sku      text PRIMARY KEY,
    on_hand  integer NOT NULL CHECK (on_hand >= 0),
    reserved integer NOT NULL DEFAULT 0 CHECK (reserved >= 0 AND reserved <= on_hand)
);
INSERT INTO stock (sku, on_hand) VALUES ('apple', 100), ('pear', 100) ON CONFLICT DO NOTHING;
