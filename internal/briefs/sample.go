package briefs

import "fmt"

// sampleSubjects are research questions about the corpus's topics, so that
// sample briefs find sources. A few deliberately share no word with any
// single document in full, which exercises the OR fallback of
// attach_sources.
var sampleSubjects = []struct{ title, body string }{
	{"Rooftop solar for a school", "Which inverters and photovoltaic panels suit a school roof, and how does net metering change the budget?"},
	{"Grid batteries and peak demand", "How do utilities use battery storage for peak shaving and frequency regulation?"},
	{"Protected bike lanes downtown", "What do city planners learn from protected bike lanes, intersection design and commuter counts?"},
	{"Saving coral reefs", "Can coral nurseries and larval seeding keep up with coral bleaching as the ocean warms?"},
	{"Sourdough at the neighbourhood bakery", "How do fermentation time and hydration ratio change a wild yeast starter's bread?"},
	{"Is quantum computing ready?", "Where do superconducting qubits stand on error correction and decoherence?"},
	{"Supply chain shocks", "Do inventory buffers and supplier diversification shorten lead times during port congestion?"},
	{"Running a remote team", "What makes asynchronous communication and written documentation work across time zones?"},
	{"Healthier farm soil", "How much do cover crops and no-till planting raise soil organic carbon?"},
	{"Before the fire season", "Do prescribed burns and fuel breaks reduce ember exposure near towns?"},
	{"Drinking water from the sea", "What do reverse osmosis membranes cost, and what happens to the brine?"},
	{"Vaccines off the grid", "How do health workers keep refrigerated transport and clinic stock cold on the last mile?"},
	{"Electrifying the bus fleet", "Is depot charging enough for battery range in winter operation?"},
	{"Plastic in our river", "Does wastewater treatment stop synthetic fibres and plastic fragments reaching freshwater fish?"},
	{"Following migrating birds", "What have GPS tags taught ornithologists about stopover sites and flyways?"},
	{"Choosing a license", "Copyleft or permissive licenses: what do maintainers need for license compliance?"},
	{"Moving freight by rail", "Can intermodal containers and freight corridors bring a modal shift from trucks?"},
	{"Heat pumps in old houses", "Do air source units need radiator sizing changes and better home insulation?"},
	{"Cleaner ocean shipping", "Can slow steaming and wind-assisted propulsion cut the carbon intensity of shipping?"},
	{"Digitizing the town archive", "What metadata standards and optical character recognition suit rare manuscripts?"},
	{"Sleep and shift work", "How does shift work disturb the circadian rhythm and deep sleep stages?"},
	{"More shade on our streets", "How much do street trees cool heat islands and absorb stormwater runoff?"},
	{"Pulling carbon from the air", "What do sorbent materials and geological storage cost per tonne of carbon removal?"},
	{"Farming through drought", "Do drip irrigation and soil moisture sensors save groundwater pumping?"},
	{"Ransomware at the hospital", "How do security teams use network segmentation and backup restores against ransomware attacks?"},
	{"Community trust in public projects", "What did residents ask for in public meetings about new local projects?"},
	{"Long-term maintenance budgets", "Which maintenance schedules extend service life, according to published data?"},
}

// Sample returns the title and body of the demo's i-th brief (0-based),
// numbered so that the briefs of one run are told apart.
func Sample(i int) (title, body string) {
	s := sampleSubjects[i%len(sampleSubjects)]
	return fmt.Sprintf("%s (#%d)", s.title, i+1), s.body
}
