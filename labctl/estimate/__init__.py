"""An analytical model of collectives on fabrics larger than one machine can emulate (pure logic)."""
